"""Sparse attention over combined index rows, and the float64 reference computed from positions.

DSV4: one 512-wide latent head where K equals V, a per-head learned sink that joins the softmax as a
virtual key of value 0, and -1 entries in an index row skipped.
"""

from __future__ import annotations

import math

import torch

from harness.kernels import sparse_attention_for
from harness.kernels.torch_attention import sparse_attention  # also harness.model.attention.sparse_attention


def sparse_attention_on(device: torch.device):
    """The sparse attention the model runs: the Triton kernel on CUDA when Triton is there (it is
    deterministic, so the bit-exact oracle holds), the torch implementation elsewhere."""
    if device.type != "cuda":
        return sparse_attention
    return sparse_attention_for(device)


def reference_attention(world, layer: int, rows: list[int] | None = None) -> torch.Tensor:
    """Float64 attention of one layer for every real query row, straight from positions and latents.

    It never touches req_to_token, the SWA mapping, page tables or index rows, so it checks them.
    Rows go in groups of one request: each row gathers its own keys (chosen compressed blocks, then
    its SWA window of latents), padded with masked slots, and the group is one batched product. It
    runs on the device the world's data is on (an H200 does about 67 TFLOP/s in float64).
    """
    dims, device = world.dims, world.device
    ratio = dims.layer_ratios[layer]
    scale = dims.head_dim ** -0.5
    sink = world.sink[layer].double()
    q_all = world.q[layer]  # rows are converted to float64 as they are used
    token_rows = world.token_rows
    wanted = range(len(token_rows)) if rows is None else rows
    out = torch.zeros(len(wanted), dims.heads, dims.head_dim, dtype=torch.float64, device=device)
    by_request: dict[int, list[tuple[int, int, int]]] = {}
    for i, t in enumerate(wanted):
        r, pos = token_rows[t]
        by_request.setdefault(r, []).append((i, t, pos))
    window = torch.arange(dims.swa_window, device=device)
    step = REFERENCE_ROWS_PER_STEP["cpu" if device.type == "cpu" else "gpu"]
    for r, items in by_request.items():
        latents = world.latents[r][layer].double()
        blocks = world.block_means(r, layer, ratio).double() if ratio else latents[:0]
        keys = torch.cat([blocks, latents])
        for chunk in range(0, len(items), step):
            part = items[chunk: chunk + step]
            pos = torch.tensor([p for _, _, p in part], device=device)
            swa = pos[:, None] - (dims.swa_window - 1) + window[None, :]  # this row's window of latents
            index = torch.where(swa >= 0, swa + blocks.shape[0], -1)
            if ratio:
                chosen = chosen_blocks(world, r, [t for _, t, _ in part], (pos + 1) // ratio, ratio)
                block_ids = torch.arange(chosen.shape[1], device=device)
                index = torch.cat([torch.where(chosen, block_ids[None, :], -1), index], dim=1)
            valid = index >= 0
            k = keys[index.clamp(min=0)]  # [n, K, D]
            queries = q_all[torch.tensor([t for _, t, _ in part], device=device)].double()
            scores = torch.einsum("nhd,nkd->nhk", queries, k) * scale
            scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
            top = torch.maximum(scores.max(dim=2).values, sink[None, :])
            weights = torch.exp(scores - top[:, :, None])
            norm = weights.sum(dim=2) + torch.exp(sink[None, :] - top)
            out[torch.tensor([i for i, _, _ in part], device=device)] = torch.einsum(
                "nhk,nkd->nhd", weights / norm[:, :, None], k)
    return out


# Rows gathered at once: on the CPU real sizes stay near 100 MB of float64 keys; a GPU takes the
# float64 oracle's 256 rows of a layer in one step (about 0.7 GB of keys at real sizes).
REFERENCE_ROWS_PER_STEP = {"cpu": 32, "gpu": 256}


def chosen_blocks(world, r: int, rows: list[int], visible: torch.Tensor, ratio: int) -> torch.Tensor:
    """Which compressed blocks each row attends to, as a mask [rows, blocks]: every visible block of a
    ratio-128 layer; for ratio 4 the indexer's choice, the top-k scores with ties to the lower block,
    all visible blocks when few are. Keys and queries are small integers, so the scores are exact."""
    blocks = world.batch.requests[r].seq_len // ratio
    block_ids = torch.arange(blocks, device=visible.device)
    visible_mask = block_ids[None, :] < visible[:, None]
    if ratio != 4:
        return visible_mask
    scores = world.q_index[torch.tensor(rows, device=visible.device)].double() @ world.index_keys[r][:blocks].double().T
    scores = scores.masked_fill(~visible_mask, float("-inf"))
    order = torch.sort(-scores, dim=1, stable=True).indices  # best first; equal scores keep block order
    rank = torch.empty_like(order).scatter_(1, order, block_ids.expand(len(rows), -1).contiguous())
    return visible_mask & (rank < world.dims.index_topk)


def ceil_align(value: int, align: int) -> int:
    return int(math.ceil(value / align) * align)
