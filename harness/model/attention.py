"""Sparse attention over combined index rows, and the float64 reference computed from positions.

DSV4: one 512-wide latent head where K equals V, a per-head learned sink that joins the softmax as a
virtual key of value 0, and -1 entries in an index row skipped.
"""

from __future__ import annotations

import itertools
import math

import torch

from harness.device import DeviceKind
from harness.kernels import sparse_attention_for
from harness.kernels.torch_attention import sparse_attention  # also harness.model.attention.sparse_attention
from harness.model.pools import to_device


# The relative error an attention output carries from its own dtype, beyond a comparison's absolute tolerance:
# none for float32 (the harness's kernels); for bf16, what SGLang's DSV4 kernels return, two half-ulps (2^-7 of
# the value: the rounding of the output, and room for a kernel that rounds its probabilities to bf16 first).
OUTPUT_RTOL = {torch.float32: 0.0, torch.bfloat16: 2.0 ** -7}


def output_rtol(dtype: torch.dtype) -> float:
    """`OUTPUT_RTOL` of an attention output's dtype; a dtype not listed has no agreed tolerance."""
    if dtype not in OUTPUT_RTOL:
        raise ValueError(f"an attention output of dtype {dtype}: the oracles compare float32 or bfloat16 only")
    return OUTPUT_RTOL[dtype]


def sparse_attention_on(device: torch.device):
    """The sparse attention the model runs: the Triton kernel on CUDA when Triton is there (it is
    deterministic, so the bit-exact oracle holds), the torch implementation elsewhere."""
    if DeviceKind.of(device) is not DeviceKind.CUDA:
        return sparse_attention
    return sparse_attention_for(device)


def reference_attention(world, layer: int, rows: list[int] | None = None, *,
                        keys: str | None = None) -> torch.Tensor:
    """Float64 attention of one layer for every real query row, straight from positions and latents.

    It never touches req_to_token, the SWA mapping, page tables or index rows, so it checks them.
    Rows go in groups of one request. Each row's keys are its chosen compressed blocks, then its SWA
    window of latents. It runs on the device the world's data is on (an H200 does about 67 TFLOP/s in
    float64). `keys` says how a row meets its keys, the same sums either way:
    - `"gathered"`: each row gathers its own keys, padded with masked slots, so the work follows the
      window and the top-k, however long the request;
    - `"masked"`: every row multiplies against all of the request's keys and masks the ones it does
      not attend to: two plain matrix products, fewer launches, no gathered copy per row;
    - None (the default): gathered on the CPU; on a GPU masked for a request of at most
      `MASKED_LATENTS_PER_WINDOW` windows of latents and gathered beyond (on an H200 at real head
      sizes masked took 2.9 ms against 3.5 ms for 300 tokens, the same at 600, 4.9 against 5.4 for
      requests of 900 and 312, 4.9 against 3.3 at 1200 and 82 against 12 at 30000, for the float64
      oracle's rows of three layers, window 128).
    """
    dims, device = world.dims, world.device
    if keys not in (None, "gathered", "masked"):
        raise ValueError(f"keys={keys!r}: gathered or masked")
    ratio = dims.layer_ratios[layer]
    scale = dims.head_dim ** -0.5
    sink = world.sink[layer].double()
    token_rows = world.token_rows
    wanted = list(range(len(token_rows))) if rows is None else list(rows)
    # The rows in request order, so that each request's rows are one slice; the host's lists go to the
    # device in one copy, not one per slice (a copy from pageable memory waits for the stream).
    order = sorted(range(len(wanted)), key=lambda i: token_rows[wanted[i]][0])
    plan = to_device(torch.tensor([order, [wanted[i] for i in order], [token_rows[wanted[i]][1] for i in order]],
                                  dtype=torch.int64), device)
    results = []
    window = torch.arange(dims.swa_window, device=device)
    on_cpu = DeviceKind.of(device) is DeviceKind.CPU
    step = REFERENCE_ROWS_PER_STEP["cpu" if on_cpu else "gpu"]
    start = 0
    for r, group in itertools.groupby(token_rows[wanted[i]][0] for i in order):
        count = len(list(group))
        latents = world.latents[r][layer].double()
        blocks = world.block_means(r, layer, ratio).double() if ratio else latents[:0]
        request_keys = torch.cat([blocks, latents])
        masked = keys == "masked" or (keys is None and not on_cpu
                                      and latents.shape[0] <= MASKED_LATENTS_PER_WINDOW * dims.swa_window)
        rows_per_step = step if not masked else max(  # masked: rows x heads x all the request's keys
            1, min(step, MASKED_SCORES_PER_STEP // (dims.heads * request_keys.shape[0])))
        for chunk in range(start, start + count, rows_per_step):
            part = slice(chunk, min(chunk + rows_per_step, start + count))
            t, pos = plan[1, part], plan[2, part]
            chosen = chosen_blocks(world, r, t, (pos + 1) // ratio, ratio) if ratio else None
            queries = world.q[layer].index_select(0, t).double()
            if masked:
                latent_ids = torch.arange(latents.shape[0], device=device)
                attended = (latent_ids[None, :] <= pos[:, None]) & (latent_ids[None, :] > pos[:, None] - dims.swa_window)
                if chosen is not None:
                    attended = torch.cat([chosen, attended], dim=1)
                scores = torch.einsum("nhd,kd->nhk", queries, request_keys) * scale
            else:
                swa = pos[:, None] - (dims.swa_window - 1) + window[None, :]  # this row's window of latents
                index = torch.where(swa >= 0, swa + blocks.shape[0], -1)
                if chosen is not None:
                    block_ids = torch.arange(chosen.shape[1], device=device)
                    index = torch.cat([torch.where(chosen, block_ids[None, :], -1), index], dim=1)
                attended = index >= 0
                gathered = request_keys[index.clamp(min=0)]  # [n, K, D]
                scores = torch.einsum("nhd,nkd->nhk", queries, gathered) * scale
            scores = scores.masked_fill(~attended[:, None, :], float("-inf"))
            top = torch.maximum(scores.max(dim=2).values, sink[None, :])
            weights = torch.exp(scores - top[:, :, None])
            weights = weights / (weights.sum(dim=2) + torch.exp(sink[None, :] - top))[:, :, None]
            results.append(torch.einsum("nhk,kd->nhd", weights, request_keys) if masked
                           else torch.einsum("nhk,nkd->nhd", weights, gathered))
        start += count
    out = torch.zeros(len(wanted), dims.heads, dims.head_dim, dtype=torch.float64, device=device)
    if results:
        out.index_copy_(0, plan[0], torch.cat(results))
    return out


# Rows gathered at once: on the CPU real sizes stay near 100 MB of float64 keys; a GPU takes the
# float64 oracle's 256 rows of a layer in one step (about 0.7 GB of keys at real sizes, gathered).
REFERENCE_ROWS_PER_STEP = {"cpu": 32, "gpu": 256}
# Masked keys: fewer rows at once for a long request, so that a chunk's float64 scores stay near 1 GiB
# (with the masked copy, the exponentials and the weights alive at once, about 5 GiB at the peak); 256
# rows of real heads reach it at about 8k keys. The default uses masked keys only up to 1024 latents.
MASKED_SCORES_PER_STEP = 1 << 27
MASKED_LATENTS_PER_WINDOW = 8  # the default's bound: masked keys for a request of up to 8 windows of latents


def chosen_blocks(world, r: int, rows: torch.Tensor, visible: torch.Tensor, ratio: int) -> torch.Tensor:
    """Which compressed blocks each row attends to, as a mask [rows, blocks]: every visible block of a
    ratio-128 layer; for ratio 4 the indexer's choice, the top-k scores with ties to the lower block,
    all visible blocks when few are. Keys and queries are small integers, so the scores are exact."""
    blocks = world.batch.requests[r].seq_len // ratio
    block_ids = torch.arange(blocks, device=visible.device)
    visible_mask = block_ids[None, :] < visible[:, None]
    if ratio != 4:
        return visible_mask
    scores = world.q_index.index_select(0, rows).double() @ world.index_keys[r][:blocks].double().T
    scores = scores.masked_fill(~visible_mask, float("-inf"))
    order = torch.sort(-scores, dim=1, stable=True).indices  # best first; equal scores keep block order
    rank = torch.empty_like(order).scatter_(1, order, block_ids.expand(len(rows), -1).contiguous())
    return visible_mask & (rank < world.dims.index_topk)


def ceil_align(value: int, align: int) -> int:
    return int(math.ceil(value / align) * align)
