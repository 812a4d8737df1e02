"""DSV4-shaped sparse-attention inputs at real sizes, shared by the kernel's tests and benchmark.

Index rows look like the harness's sparse prefill: top-k compressed blocks first (ratio 4, the
blocks a token can see, -1 past them), then the sliding window (-1 before the sequence start), so
neighbouring tokens share most rows, as they do in a real prefill.
"""

from __future__ import annotations

import torch

ROWS_PER_STEP = 4096  # rows of the top-k draw per step, to bound the [rows, blocks] score matrix


def dsv4_indices(tokens: int, *, topk: int = 512, window: int = 128, ratio: int = 4,
                 device: str | torch.device = "cpu", seed: int = 0) -> tuple[torch.Tensor, int]:
    """[tokens, topk + window] int32 rows into a kv of `tokens // ratio` compressed rows followed
    by `tokens` window rows; returns (indices, kv rows)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    blocks = tokens // ratio
    pos = torch.arange(tokens, device=device)
    parts = []
    for start in range(0, tokens, ROWS_PER_STEP):
        p = pos[start:start + ROWS_PER_STEP]
        visible = (p + 1) // ratio
        cols = torch.arange(max(blocks, topk), device=device)
        score = torch.rand(len(p), len(cols), generator=gen, device=device)
        score = torch.where(cols[None, :] < visible[:, None], score, -1.0)
        top, chosen = score.topk(topk, dim=1)
        chosen = torch.where(top >= 0, chosen, -1)
        parts.append(torch.where(chosen >= 0, chosen, blocks * 2 + tokens).sort(dim=1).values)
    comp = torch.cat(parts)
    comp = torch.where(comp < blocks, comp, -1)
    win = pos[:, None] - window + 1 + torch.arange(window, device=device)[None, :]
    win = torch.where(win >= 0, win + blocks, -1)
    return torch.cat([comp, win], dim=1).to(torch.int32), blocks + tokens


def dsv4_inputs(tokens: int, *, heads: int = 64, head_dim: int = 512, topk: int = 512, window: int = 128,
                dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu", seed: int = 0):
    """(q, kv, indices, sink, scale) for one attention layer. The sink is drawn near log(W) so it
    carries a sizeable share of the softmax and a kernel that drops it is visibly wrong."""
    gen = torch.Generator(device=device).manual_seed(seed)
    indices, rows = dsv4_indices(tokens, topk=topk, window=window, device=device, seed=seed)
    q = torch.randn(tokens, heads, head_dim, generator=gen, device=device).to(dtype)
    kv = torch.randn(rows, head_dim, generator=gen, device=device).to(dtype)
    sink = torch.randn(heads, generator=gen, device=device) + 6.0
    return q, kv, indices, sink, head_dim ** -0.5
