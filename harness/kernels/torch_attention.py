"""The plain-torch sparse attention, the Triton kernel's twin: what the model runs off CUDA (and on CUDA
without Triton), and what the kernel's tests compare against.

Kernels sit below the model: the model (`harness.model.attention`) picks one of these per device and
re-exports this one as `harness.model.attention.sparse_attention`.
"""

from __future__ import annotations

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
