"""A torch stand-in for the compiled package `flash_mla` (the `sgl-flash-mla` wheel: DeepSeek's FlashMLA as
SGLang's fork builds it), as far as SGLang 0.5.23's wrapper `sglang/kernels/ops/attention/flash_mla_interface.py`
uses it on the DSV4 prefill path.

Why: that wrapper imports `flash_mla` at import time and the DSV4 backend calls it on every sparse prefill,
but the wheel's CUDA extension loads neither on the CPU simulator nor on a GPU host without the wheel.
`install()` registers this module under the package's names; it refuses where a loadable `flash_mla` is
already imported, since only compiled code that cannot load is stood in. The releases before 0.5.23 call the
same four ops through `sgl_kernel.flash_mla` (the sglang-kernel wheel's copy of upstream's interface, the same
signatures; their DSV4 backend keeps only the output of each call): `install("sgl_kernel.flash_mla")`.

What it computes is the op's documented contract, each source listed in `OPS`: the same inputs (the
kernel's dtype and shape checks), the same outputs (dtypes, shapes, the base of the statistics, what a
row with no valid key gets), the same in-place writes (only the decode's `FlashMLASchedMeta`).
Deterministically: float32 from the bf16 inputs, in a fixed order of plain torch ops, rows in fixed
chunks; no atomics, no split-KV. Inputs are bf16, so TF32, where a caller enabled it, multiplies Q.K
exactly, and P keeps more bits than the kernel's bf16 P. Outputs agree with the kernel to its
tolerance, not bit for bit: the kernel's online softmax rounds in another order.

Assumptions where the fork's Python API is not public in the form 0.5.23 calls (see `OPS`):
- `return_log2_lse=True`, or None with `use_legacy=True`: max_logits and lse are the natural ones times
  log2(e) (the fork's legacy `sparse_prefill_fwd` multiplies them by LOG_2_E); otherwise natural.
- `use_legacy`, `kv_format`, `descale_q` and `descale_k` are keyword arguments of
  `flash_mla_with_kvcache`; only the legacy V4 form (584-byte tokens, kv_format None, no descale) is
  stood in. The decode's `use_legacy=False` side (the V4.1 interleaved caches) is not.
- The stand-in keeps no tile schedule: `FlashMLASchedMeta.tile_scheduler_metadata` and `num_splits`
  stay as the caller left them (a schedule only splits the work); `have_initialized` and `config` are
  written and checked as upstream's Python wrapper does.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import types

import torch

_FLASHMLA = "https://github.com/deepseek-ai/FlashMLA/blob/9241ae3ef9bac614dd25e45e507e089f888280e0/"
_FORK = "https://github.com/sgl-project/FlashMLA/blob/df022ebafb88578eab9f0300606ee765608d8b5c/"
_WRAPPER = "sglang 0.5.23: sglang/kernels/ops/attention/flash_mla_interface.py"

# Each op replaced, with the sources of its contract.
OPS = (
    ("flash_mla.flash_mla_interface.FlashMLASchedMeta", _FLASHMLA + "flash_mla/flash_mla_interface.py"),
    ("flash_mla.get_mla_metadata", _FLASHMLA + "flash_mla/flash_mla_interface.py (get_mla_metadata)"),
    ("flash_mla.flash_mla_sparse_fwd",
     _FLASHMLA + "flash_mla/flash_mla_interface.py (docstring); " + _FLASHMLA + "tests/ref.py (ref_sparse_attn_fwd); "
     + _FLASHMLA + "csrc/sm90/prefill/sparse/phase1.cuh (a row with no valid key); "
     + _FORK + "csrc/python_api.cpp (sparse_prefill_fwd: legacy statistics times LOG_2_E); " + _WRAPPER),
    ("flash_mla.flash_mla_with_kvcache",
     _FLASHMLA + "flash_mla/flash_mla_interface.py; " + _FLASHMLA + "tests/ref.py (ref_sparse_attn_decode); "
     + _FLASHMLA + "tests/quant.py (MODEL1_FP8Sparse layout); " + _FLASHMLA + "csrc/api/sparse_decode.h; "
     + _FLASHMLA + "csrc/smxx/decode/combine/combine.cu (lse without the sink); "
     + "sglang 0.5.23: sglang/kernels/ops/attention/dsv4/dequant_k_cache.py (the same layout); " + _WRAPPER),
    ("flash_mla.get_mla_decoding_metadata", _WRAPPER + " (not stood in: raises NotImplementedError)"),
    ("flash_mla.fused_norm_rope_attn_rope_cast", _WRAPPER + " (not stood in: raises NotImplementedError)"),
)

LOG2E = math.log2(math.e)

# The V4 ("MODEL1") FP8 cache. A token is 448 e4m3 NoPE values in tiles of 64, each tile scaled by one
# ue8m0 byte (2 ** (byte - 127)), and 64 bf16 RoPE values: 584 bytes. A page holds its tokens' NoPE+RoPE
# (576 bytes each) first, then their scales (8 bytes each: 7 and a pad); pages are k_cache.stride(0) apart.
V4_NOPE, V4_ROPE, V4_TILE = 448, 64, 64
V4_TILES = V4_NOPE // V4_TILE
V4_DATA_BYTES = V4_NOPE + 2 * V4_ROPE  # 576
V4_SCALE_BYTES = V4_TILES + 1  # 8
V4_BYTES_PER_TOKEN = V4_DATA_BYTES + V4_SCALE_BYTES  # 584
_FP8_CACHE_DTYPES = (torch.float8_e4m3fn, torch.int8, torch.uint8)

# Gathered float32 key elements per step: a chunk of rows at a time, so real sizes fit in memory.
KEYS_PER_STEP = 1 << 24


@dataclasses.dataclass
class FlashMLASchedMeta:
    """Upstream's scheduling record. `get_mla_metadata()` returns an empty one; the first decode call
    records its shapes in `config` and later calls must match them. The tensors are the kernel's tile
    schedule, which the stand-in neither builds nor needs (SGLang may fill them; they are kept)."""

    @dataclasses.dataclass
    class Config:
        b: int
        s_q: int
        h_q: int
        page_block_size: int
        h_k: int
        causal: bool
        is_fp8_kvcache: bool
        topk: int | None
        extra_page_block_size: int | None
        extra_topk: int | None

    have_initialized: bool = False
    config: Config | None = None
    tile_scheduler_metadata: torch.Tensor | None = None
    num_splits: torch.Tensor | None = None


def get_mla_metadata(*args, **kwargs) -> tuple[FlashMLASchedMeta, None]:
    """An empty `FlashMLASchedMeta` and None, whatever the arguments (upstream keeps them only for the
    old interface's callers)."""
    return FlashMLASchedMeta(), None


def get_mla_decoding_metadata(*args, **kwargs):
    """The legacy split-KV schedule as tensors: only the dense and tensor-metadata decode forms use it,
    and neither is on the DSV4 prefill path."""
    raise NotImplementedError("flash_mla stand-in: get_mla_decoding_metadata (the legacy tensor schedule) is "
                              "not stood in; the DSV4 prefill path uses get_mla_metadata()")


def _mega_not_stood_in(*args, **kwargs):
    raise NotImplementedError("flash_mla stand-in: fused_norm_rope_attn_rope_cast (MegaAttention, fused "
                              "norm/RoPE/FP8 cast) is not stood in; it runs only when a cos_sin_cache is passed")


# `from flash_mla import fused_norm_rope_attn_rope_cast as _mega` binds at import; `_mega.prefill(...)`
# and `_mega.decode(...)` are the calls.
fused_norm_rope_attn_rope_cast = types.ModuleType("flash_mla.fused_norm_rope_attn_rope_cast",
                                                  "MegaAttention: not stood in, each call raises")
fused_norm_rope_attn_rope_cast.prefill = _mega_not_stood_in
fused_norm_rope_attn_rope_cast.decode = _mega_not_stood_in


def _require(ok: bool, message: str) -> None:
    """The kernel's TORCH_CHECKs, as ValueError."""
    if not ok:
        raise ValueError(f"flash_mla stand-in: {message}")


def _check(name: str, t: torch.Tensor | None, dtype: torch.dtype, shape: tuple) -> None:
    if t is not None:
        _require(t.dtype == dtype, f"{name} must be {dtype}, got {t.dtype}")
        _require(tuple(t.shape) == shape, f"{name} must have shape {shape}, got {tuple(t.shape)}")


def _attend(q: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor, scale: float, d_v: int,
            sink: torch.Tensor | None):
    """Softmax attention of rows over their own keys: q [n, h, d] and keys [n, t, d] float32 (invalid keys
    zeroed), valid [n, t]. Returns out [n, h, d_v] float32, max_logits and lse [n, h] (natural log, without
    the sink; -inf and +inf where a row has no valid key, whose out is 0). The sink joins only out's
    denominator: out = sum_t exp(l_t - logaddexp(lse, sink)) v_t, so sink +inf gives 0 and -inf nothing."""
    logits = torch.einsum("nhd,ntd->nht", q, keys) * scale
    logits = logits.masked_fill(~valid[:, None, :], -math.inf)
    max_logits = logits.amax(dim=-1)
    lse = torch.logsumexp(logits, dim=-1)
    norm = lse if sink is None else torch.logaddexp(lse, sink[None, :])
    lonely = ~valid.any(dim=-1)[:, None]
    norm = norm.masked_fill(lonely, math.inf)  # weights exp(-inf - inf) = 0, not NaN
    out = torch.einsum("nht,ntv->nhv", torch.exp(logits - norm[..., None]), keys[..., :d_v])
    return out, max_logits, lse.masked_fill(lonely, math.inf)


def _counted_columns(idx: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The index columns [topk] some query counts, with their validity: a column no query counts adds nothing
    to any output, so on the CPU it is dropped before the keys are gathered (the first is kept where none
    counts: rows need a column). On CUDA every column is kept: which ones to drop is known only on the host,
    and reading it there waits for the forward stream, so the host could not issue the forward ahead of the GPU
    and the scheduler's work after the read-done event could not overlap the forward's tail (issue 30's figure)."""
    if valid.is_cuda:
        return idx, valid
    used = valid.any(dim=0)
    used[0] |= not bool(used.any())
    return idx[:, used], valid[:, used]


def _row_chunks(rows: int, keys_per_row: int):
    step = max(1, KEYS_PER_STEP // max(1, keys_per_row))
    for start in range(0, rows, step):
        yield slice(start, min(rows, start + step))


def flash_mla_sparse_fwd(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sm_scale: float,
                         d_v: int = 512, attn_sink: torch.Tensor | None = None,
                         topk_length: torch.Tensor | None = None, *, use_legacy: bool = True,
                         return_log2_lse: bool | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sparse prefill: q [s_q, h_q, d_qk] bf16, kv [s_kv, 1, d_qk] bf16, indices [s_q, 1, topk] int32.

    Query i attends to kv[j] for each j in indices[i, 0, :topk_length[i]] with 0 <= j < s_kv (every other
    index, -1 or out of range, is skipped), values kv[j, 0, :d_v]. attn_sink [h_q] float32 multiplies out
    by exp(lse) / (exp(lse) + exp(sink)). Returns (out [s_q, h_q, d_v] bf16, max_logits [s_q, h_q] float32,
    lse [s_q, h_q] float32): a row with no valid index has out 0, max_logits -inf, lse +inf. The statistics
    are base 2 (natural times log2(e)) when `return_log2_lse`, or when it is None and `use_legacy`.

    Upstream's kernel also takes only d_qk 512 or 576, d_v 512 and h_q 64 or 128; the stand-in takes any,
    so that small cases run (SGLang's DSV4 backend asserts 512 itself)."""
    _require(q.ndim == 3 and kv.ndim == 3 and indices.ndim == 3, "q, kv and indices must be 3-D")
    s_q, h_q, d_qk = q.shape
    s_kv, h_kv, topk = kv.shape[0], kv.shape[1], indices.shape[2]
    _require(h_kv == 1, f"h_kv must be 1 (MQA), got {h_kv}")
    _require(0 < d_v <= d_qk and topk > 0, f"need 0 < d_v <= d_qk and topk > 0, got {d_v=}, {d_qk=}, {topk=}")
    _check("q", q, torch.bfloat16, (s_q, h_q, d_qk))
    _check("kv", kv, torch.bfloat16, (s_kv, h_kv, d_qk))
    _check("indices", indices, torch.int32, (s_q, h_kv, topk))
    _check("attn_sink", attn_sink, torch.float32, (h_q,))
    _check("topk_length", topk_length, torch.int32, (s_q,))
    log2 = use_legacy if return_log2_lse is None else bool(return_log2_lse)

    out = torch.empty((s_q, h_q, d_v), dtype=torch.bfloat16, device=q.device)
    max_logits = torch.empty((s_q, h_q), dtype=torch.float32, device=q.device)
    lse = torch.empty((s_q, h_q), dtype=torch.float32, device=q.device)
    kv2 = kv[:, 0, :]
    sink = None if attn_sink is None else attn_sink.float()
    every_idx = indices[:, 0, :].long()
    counted = (every_idx >= 0) & (every_idx < s_kv)
    if topk_length is not None:
        counted &= torch.arange(topk, device=q.device)[None, :] < topk_length[:, None]
    every_idx, counted = _counted_columns(every_idx, counted)
    for rows in _row_chunks(s_q, every_idx.shape[1] * d_qk):
        idx, valid = every_idx[rows], counted[rows]
        if s_kv:
            keys = kv2[torch.where(valid, idx, 0)].float()
        else:  # nothing to gather: every index is out of range
            keys = torch.zeros((idx.shape[0], idx.shape[1], d_qk), dtype=torch.float32, device=q.device)
        keys = keys.masked_fill(~valid[..., None], 0.0)  # a skipped key's NaN must not reach out
        o, m, s = _attend(q[rows].float(), keys, valid, sm_scale, d_v, sink)
        out[rows] = o.to(torch.bfloat16)
        max_logits[rows] = m * LOG2E if log2 else m
        lse[rows] = s * LOG2E if log2 else s
    return out, max_logits, lse


def _v4_pages(k_cache: torch.Tensor, name: str) -> torch.Tensor:
    """k_cache [num_pages, page_size, 1, 584] (a view of a larger page buffer) as [num_pages, page_size * 584]
    bytes, pages k_cache.stride(0) apart, as the kernel addresses them."""
    _require(k_cache.ndim == 4, f"{name} must be [num_pages, page_size, 1, bytes_per_token]")
    _require(k_cache.dtype in _FP8_CACHE_DTYPES, f"{name} must be float8_e4m3fn, int8 or uint8, got {k_cache.dtype}")
    if k_cache.shape[-1] != V4_BYTES_PER_TOKEN:
        raise NotImplementedError(f"flash_mla stand-in: {name} with {k_cache.shape[-1]} bytes per token: only the V4 "
                                  f"layout ({V4_BYTES_PER_TOKEN} bytes: fp8 NoPE, ue8m0 scales, bf16 RoPE) is stood in")
    _require(k_cache.shape[2] == 1, f"{name}: h_k must be 1, got {k_cache.shape[2]}")
    _require(k_cache.stride(1) == V4_BYTES_PER_TOKEN and k_cache.stride(3) == 1,
             f"{name}: each page must be contiguous")
    pages, page_size = k_cache.shape[0], k_cache.shape[1]
    return k_cache.view(torch.uint8).as_strided((pages, page_size * V4_BYTES_PER_TOKEN), (k_cache.stride(0), 1))


def _gather_v4(pages: torch.Tensor, page_size: int, tokens: torch.Tensor) -> torch.Tensor:
    """Dequantize the tokens (indices page * page_size + slot, each in range) to bf16 [..., 512], as the
    kernel does: each NoPE value times its tile's 2 ** (byte - 127), rounded to bf16; RoPE as stored."""
    flat = tokens.reshape(-1).long()
    page, slot = (flat // page_size)[:, None], (flat % page_size)[:, None]
    data = pages[page, slot * V4_DATA_BYTES + torch.arange(V4_DATA_BYTES, device=pages.device)]
    scale_at = page_size * V4_DATA_BYTES + slot * V4_SCALE_BYTES + torch.arange(V4_TILES, device=pages.device)
    scales = pages[page, scale_at].view(torch.float8_e8m0fnu).float()
    nope = data[:, :V4_NOPE].view(torch.float8_e4m3fn).float().view(-1, V4_TILES, V4_TILE) * scales[:, :, None]
    rope = data[:, V4_NOPE:].contiguous().view(torch.bfloat16)
    keys = torch.cat([nope.reshape(-1, V4_NOPE).to(torch.bfloat16), rope], dim=1)
    return keys.view(*tokens.shape, V4_NOPE + V4_ROPE)


def _distinct_v4(pages: torch.Tensor, page_size: int, tokens: torch.Tensor, d_qk: int):
    """The distinct tokens of `tokens` dequantized (`_gather_v4`): (table [n, 512] bf16, the position of each
    token in it, shaped as `tokens`). No pages: every index is -1 (checked), so a table of one zero key."""
    if not pages.shape[0]:
        return torch.zeros((1, d_qk), dtype=torch.bfloat16, device=tokens.device), torch.zeros_like(tokens).long()
    distinct, which = torch.unique(tokens, return_inverse=True)
    return _gather_v4(pages, page_size, distinct), which


def _v4_scope(name: str, k_cache, indices, topk_length, b: int, s_q: int):
    """One cache and its indices [b, s_q, topk] int32: -1 is skipped, as is every position at or past
    topk_length[b]; any other index must address a token of the cache (the kernel reads it unchecked)."""
    pages = _v4_pages(k_cache, name)
    _require(indices is not None and indices.ndim == 3, f"indices of {name} must be [b, s_q, topk]")
    topk = indices.shape[2]
    _require(topk > 0, f"topk of {name} must be > 0")
    _check(f"indices of {name}", indices, torch.int32, (b, s_q, topk))
    length_name = "topk_length" if name == "k_cache" else "extra_topk_length"
    _check(length_name, topk_length, torch.int32, (b,))
    valid = indices != -1
    if topk_length is not None:
        valid &= torch.arange(topk, device=indices.device)[None, None, :] < topk_length[:, None, None]
    capacity = pages.shape[0] * k_cache.shape[1]
    if not (indices.is_cuda and torch.cuda.is_current_stream_capturing()):  # a graph capture cannot sync
        bad = valid & ((indices < 0) | (indices >= capacity))
        _require(not bool(bad.any()), f"indices of {name} outside [-1, {capacity}) at {bad.nonzero()[:4].tolist()}")
    indices, valid = indices.reshape(b * s_q, topk), valid.reshape(b * s_q, topk)
    indices, valid = _counted_columns(indices, valid)
    return pages, k_cache.shape[1], indices, valid


def flash_mla_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor | None,
                           cache_seqlens: torch.Tensor | None, head_dim_v: int,
                           tile_scheduler_metadata: FlashMLASchedMeta, num_splits: None = None,
                           softmax_scale: float | None = None, causal: bool = False, is_fp8_kvcache: bool = False,
                           indices: torch.Tensor | None = None, attn_sink: torch.Tensor | None = None,
                           extra_k_cache: torch.Tensor | None = None,
                           extra_indices_in_kvcache: torch.Tensor | None = None,
                           topk_length: torch.Tensor | None = None, extra_topk_length: torch.Tensor | None = None,
                           *, use_legacy: bool = True, kv_format: str | None = None,
                           descale_q: torch.Tensor | None = None,
                           descale_k: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse decode over the V4 FP8 paged cache, the form SGLang's DSV4 backend calls (also for prefill):
    q [b, s_q, h_q, 512] bf16; k_cache [num_pages, page_size, 1, 584]; indices [b, s_q, topk] int32 of
    page * page_size + slot; topk_length [b]; attn_sink [h_q] float32; an optional extra cache with its own
    indices and lengths, attended jointly with the main one. Returns (out [b, s_q, h_q, 512] bf16,
    lse [b, h_q, s_q] float32, natural log, without the sink, +inf where a query has no valid key): the
    transposed view of a [b, s_q, h_q] tensor, as the kernel returns it. Only -1 is skipped: a counted
    index outside the cache raises ValueError where the kernel would read out of bounds (not checked
    while a CUDA graph is being captured, which cannot synchronize).

    Dense decode (indices None), the legacy tensor schedule, `kv_format`, FP8 descales and the current
    kernel set (use_legacy=False) are not stood in: NotImplementedError names the argument."""
    if not isinstance(tile_scheduler_metadata, FlashMLASchedMeta) or num_splits is not None:
        raise NotImplementedError("flash_mla stand-in: tile_scheduler_metadata must be a FlashMLASchedMeta and "
                                  "num_splits None; the legacy tensor schedule is not stood in")
    for arg, unsupported in (("indices=None (dense decode)", indices is None),
                             ("use_legacy=False (the current kernel set)", not use_legacy),
                             (f"kv_format={kv_format!r}", kv_format is not None),
                             ("descale_q", descale_q is not None), ("descale_k", descale_k is not None)):
        if unsupported:
            raise NotImplementedError(f"flash_mla stand-in: {arg} is not stood in; only the legacy sparse V4 FP8 "
                                      "decode is (indices given, use_legacy=True, kv_format None, no descales)")
    if causal:
        raise AssertionError("causal must be False when sparse attention is enabled")
    if not is_fp8_kvcache:
        raise AssertionError("is_fp8_kvcache must be True when sparse attention is enabled")
    if (extra_k_cache is None) != (extra_indices_in_kvcache is None) or (extra_k_cache is None
                                                                         and extra_topk_length is not None):
        raise ValueError("flash_mla stand-in: extra_k_cache and extra_indices_in_kvcache go together, "
                         "and extra_topk_length needs them")
    _require(q.ndim == 4, "q must be [b, s_q, h_q, d_qk]")
    b, s_q, h_q, d_qk = q.shape
    _require(q.dtype == torch.bfloat16, f"q must be bfloat16, got {q.dtype}")
    _require(d_qk == V4_NOPE + V4_ROPE and head_dim_v == 512, f"the V4 layout needs d_qk 512 and head_dim_v 512, "
                                                              f"got {d_qk} and {head_dim_v}")
    _check("attn_sink", attn_sink, torch.float32, (h_q,))
    _record_config(tile_scheduler_metadata, q, k_cache, causal, is_fp8_kvcache, indices,
                   extra_k_cache, extra_indices_in_kvcache)
    scale = d_qk ** -0.5 if softmax_scale is None else softmax_scale

    scopes = [_v4_scope("k_cache", k_cache, indices, topk_length, b, s_q)]
    if extra_k_cache is not None:
        scopes.append(_v4_scope("extra_k_cache", extra_k_cache, extra_indices_in_kvcache, extra_topk_length, b, s_q))
    total_topk = sum(scope[2].shape[1] for scope in scopes)
    qf = q.reshape(b * s_q, h_q, d_qk)
    out = torch.empty((b * s_q, h_q, head_dim_v), dtype=torch.bfloat16, device=q.device)
    lse = torch.empty((b * s_q, h_q), dtype=torch.float32, device=q.device)
    sink = None if attn_sink is None else attn_sink.float()
    # Each distinct token dequantized once (rows share most of their keys: a window slides by one per query).
    tables = [_distinct_v4(pages, page_size, torch.where(ok, idx, 0), d_qk) for pages, page_size, idx, ok in scopes]
    for rows in _row_chunks(b * s_q, total_topk * d_qk):
        keys, valid = [], []
        for (table, which), (_, _, _, ok) in zip(tables, scopes):
            keys.append(table[which[rows]].float().masked_fill(~ok[rows][..., None], 0.0))
            valid.append(ok[rows])
        o, _, s = _attend(qf[rows].float(), torch.cat(keys, dim=1), torch.cat(valid, dim=1), scale, head_dim_v, sink)
        out[rows] = o.to(torch.bfloat16)
        lse[rows] = s
    return out.view(b, s_q, h_q, head_dim_v), lse.view(b, s_q, h_q).transpose(1, 2)


def _record_config(meta: FlashMLASchedMeta, q, k_cache, causal, is_fp8_kvcache, indices, extra_k_cache,
                   extra_indices) -> None:
    """Upstream's in-place write on the first call, and its check on the later ones: a schedule is reused
    only for calls of the same shapes."""
    config = FlashMLASchedMeta.Config(
        q.shape[0], q.shape[1], q.shape[2], k_cache.shape[1], k_cache.shape[2], causal, is_fp8_kvcache,
        indices.shape[-1], None if extra_k_cache is None else extra_k_cache.shape[1],
        None if extra_indices is None else extra_indices.shape[-1])
    if not meta.have_initialized:
        meta.have_initialized, meta.config = True, config
        return
    for field in dataclasses.fields(config):
        if getattr(meta.config, field.name) != getattr(config, field.name):
            raise AssertionError(f"sched_meta.config.{field.name} is {getattr(meta.config, field.name)!r}, this call "
                                 f"has {getattr(config, field.name)!r}: the input arguments are inconsistent with "
                                 "sched_meta; reuse one only across calls of the same shapes")


# `from flash_mla.flash_mla_interface import FlashMLASchedMeta`: the submodule, with what upstream's has.
flash_mla_interface = types.ModuleType("flash_mla.flash_mla_interface", "The stand-in's flash_mla_interface")
# `from sgl_kernel.flash_mla import flash_mla_sparse_fwd`: the PR-era releases (0.5.19 to 0.5.22) call FlashMLA
# through sglang-kernel's copy of upstream's interface (the same four names, the same signatures).
sgl_kernel_flash_mla = types.ModuleType("sgl_kernel.flash_mla", "The stand-in's sgl_kernel.flash_mla")
for _name in ("FlashMLASchedMeta", "get_mla_metadata", "flash_mla_with_kvcache", "flash_mla_sparse_fwd"):
    setattr(flash_mla_interface, _name, globals()[_name])
    setattr(sgl_kernel_flash_mla, _name, globals()[_name])
del _name

# Where a release imports FlashMLA from (`Generation.flash_mla`): the names this module is registered under.
PACKAGES = ("flash_mla", "sgl_kernel.flash_mla")


def _entries(package: str) -> dict:
    if package == "flash_mla":
        return {"flash_mla": sys.modules[__name__], "flash_mla.flash_mla_interface": flash_mla_interface,
                "flash_mla.fused_norm_rope_attn_rope_cast": fused_norm_rope_attn_rope_cast}
    if package == "sgl_kernel.flash_mla":
        return {"sgl_kernel.flash_mla": sgl_kernel_flash_mla}
    raise ValueError(f"package={package!r}: allowed: {', '.join(PACKAGES)}")


def _refuse_loadable(name: str, stand_in=None) -> None:
    """RuntimeError where a loadable module (one with a file, not `stand_in`) is already imported as `name`."""
    present = sys.modules.get(name)
    if present is not None and present is not stand_in and getattr(present, "__file__", None):
        raise RuntimeError(f"{name} is already imported from {present.__file__}: it loads, so it is not stood in")


def install(package: str = "flash_mla") -> dict:
    """Register the stand-in in sys.modules under `package`'s names: for `flash_mla`, the package,
    `flash_mla.flash_mla_interface` and `flash_mla.fused_norm_rope_attn_rope_cast` (so that the submodule imports
    too); for `sgl_kernel.flash_mla`, that submodule, also bound on `sgl_kernel` where that is imported (the
    recording stand-in of a GPU host without the sglang-kernel wheel), else under an `sgl_kernel` package that
    holds only it (a host without CUDA, where nothing else of sgl_kernel is imported). Returns {name: module} as
    installed. Raises RuntimeError where a loadable module (one with a file) is already imported under a name."""
    entries = _entries(package)
    for name, module in entries.items():
        _refuse_loadable(name, module)
    if package == "sgl_kernel.flash_mla":
        _refuse_loadable("sgl_kernel")
        parent = sys.modules.get("sgl_kernel")
        if parent is None:
            parent = types.ModuleType("sgl_kernel", "Holds only the FlashMLA stand-in (sglang-kernel cannot load)")
            parent.__path__ = []
            sys.modules["sgl_kernel"] = parent
        parent.flash_mla = sgl_kernel_flash_mla
    sys.modules.update(entries)
    return entries
