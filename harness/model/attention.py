"""Sparse attention over combined index rows, and the float64 reference computed from positions.

DSV4: one 512-wide latent head where K equals V, a per-head learned sink that joins the softmax as a
virtual key of value 0, and -1 entries in an index row skipped.
"""

from __future__ import annotations

import math

import torch

ROW_CHUNK = 2048  # rows per step, so real-size inputs (tens of thousands of tokens) fit in memory


def sparse_attention(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sink: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """q [T, H, D], kv [N, D], indices [T, W] (-1 = skip), sink [H] -> out [T, H, D]. Deterministic."""
    out = torch.empty_like(q)
    for start in range(0, q.shape[0], ROW_CHUNK):
        stop = min(start + ROW_CHUNK, q.shape[0])
        idx = indices[start:stop].long()
        valid = idx >= 0
        keys = kv[idx.clamp(min=0)]  # [t, W, D]
        scores = torch.einsum("thd,twd->thw", q[start:stop], keys) * scale
        scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
        sink_col = sink[None, :, None].expand(stop - start, -1, 1).to(scores.dtype)
        probs = torch.softmax(torch.cat([scores, sink_col], dim=-1), dim=-1)[..., :-1]
        out[start:stop] = torch.einsum("thw,twd->thd", probs, keys)
    return out


def reference_attention(world, layer: int, rows: list[int] | None = None) -> torch.Tensor:
    """Float64 attention of one layer for every real query row, straight from positions and latents.

    It never touches req_to_token, the SWA mapping, page tables or index rows, so it checks them.
    """
    dims = world.dims
    ratio = dims.layer_ratios[layer]
    scale = dims.head_dim ** -0.5
    sink = world.sink[layer].double()
    q_all = world.q[layer].double()
    latents = [lat[layer].double() for lat in world.latents]
    blocks = [world.block_means(r, layer, ratio).double() if ratio else None for r in range(len(latents))]
    wanted = None if rows is None else set(rows)
    rows = []
    for t, (r, pos) in enumerate(world.token_rows()):
        if wanted is not None and t not in wanted:
            continue
        swa_len = min(pos + 1, dims.swa_window)
        k = latents[r][pos - swa_len + 1:pos + 1]
        if ratio:
            visible = (pos + 1) // ratio
            chosen = indexer_topk(world, r, t, visible) if ratio == 4 else list(range(visible))
            if chosen:
                k = torch.cat([blocks[r][chosen], k])
        scores = (q_all[t] @ k.T) * scale
        top = torch.maximum(scores.max(dim=1).values, sink)
        weights = torch.exp(scores - top[:, None])
        norm = weights.sum(dim=1) + torch.exp(sink - top)
        rows.append((weights / norm[:, None]) @ k)
    if not rows:
        return torch.zeros(0, dims.heads, dims.head_dim, dtype=torch.float64)
    return torch.stack(rows)


def indexer_topk(world, r: int, t: int, visible: int) -> list[int]:
    """The indexer's choice: top-k scores, ties to the lower block; all blocks when few are visible.

    Keys and queries are small integers, so float32 and float64 agree exactly on every score.
    """
    topk = world.dims.index_topk
    if visible <= topk:
        return list(range(visible))
    scores = (world.index_keys[r][:visible] @ world.q_index[t]).tolist()
    order = sorted(range(visible), key=lambda b: (-scores[b], b))
    return sorted(order[:topk])


def ceil_align(value: int, align: int) -> int:
    return int(math.ceil(value / align) * align)
