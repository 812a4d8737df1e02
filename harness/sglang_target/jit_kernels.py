"""Torch stand-ins for the CUDA-only JIT kernels that SGLang's DSV4 backend and KV pool (every release) reach on the
eager prefill path, where they cannot be built (no GPU, or no matching nvcc arch): each replaces only the
compiled module that SGLang's own Python loads (`load_jit(...)`), so SGLang's wrapper around it still runs.

Ops replaced, each with its source of truth (the `.cuh` ships in the wheel under
`sglang/kernels/jit/csrc/deepseek_v4/`):

- `sglang.kernels.ops.attention.dsv4.attn._jit_fused_store_module("flashmla", ..., layout=V4)`: the module
  `FusedStoreCacheFlashMLAKernel<..., V4>::run(input, cache, indices)` of `store.cuh`
  (`fused_store_flashmla_cache`), reached by `DeepSeekV4TokenToKVPool.set_swa_key_buffer_radix_fused` (the
  backend's `store_cache`) and `set_extra_key_buffer_fused` (the compressed caches). Contract: per token row,
  7 NoPE tiles of 64: scale = max(1e-4, amax) / 448 rounded up to a power of two (ue8m0: biased exponent,
  +1 when the mantissa is non-zero), values times 1 / scale clipped to +-448 and cast to e4m3 (RNE), the
  ue8m0 byte at the token's scale row; the 64 RoPE values cast to bf16 after the NoPE bytes. Page
  `loc >> log2(page_size)`, slot `loc & (page_size - 1)`; data at `page * page_bytes + slot * 576`, scales at
  `page * page_bytes + page_size * 576 + slot * 8` (the 8th scale byte is padding, never written). Every row
  is written (the kernel skips none); an index outside the cache, which the kernel would write out of
  bounds, raises ValueError here. SGLang's own Triton port of this kernel (ROCm,
  `kernels/ops/kvcache/triton_store_cache.py`) differs only in its epsilon (1e-8): the tests compare both.
- `sglang.kernels.ops.attention.dsv4.compress._jit_compress_plan_module().plan_prefill`: `plan_compress_prefill`
  of `c_plan.cuh`, its CPU-input path (the one SGLang's eager prefill takes: `seq_lens` / `extend_lens` on the
  host): the host loop over requests that emits a CompressPlan (16 bytes) for each position whose
  `position + 1` is a multiple of the ratio and a WritePlan (8 bytes) for each position the state ring keeps,
  then `plan_compress_prefill_kernel_1`, which translates the request-local positions to state-ring slots
  through `req_to_token` and `full_to_state` (c4, paged ring) or `req_pool_index * ring + position % ring`
  (c128, or a request ring). Padding to `num_q_tokens` with invalid plans only under `use_cuda_graph`.
- `...compress._jit_compress_plan_module().plan_decode`: `plan_compress_decode` of `c_plan.cuh`
  (`plan_compress_decode_kernel`), reached by an eager DECODE batch's metadata: one DecodePlan (16 bytes) per
  request, its last position's state-ring slot and the ring pages of that position and of the one a ratio before.
  The legacy and GPU-input planners are not stood in (NotImplementedError).

Not a kernel: `CompressorPrefillPlan.generate` allocates its host scratch with `pin_memory=True`, which needs a
CUDA driver. `install()` gives that module a `torch` whose `empty` drops `pin_memory` when no CUDA device is
visible (pinning changes only the copy's speed, and the stand-in planner reads the buffer as plain memory).

The releases before 0.5.23 load the same kernels with other arguments: 0.5.19's and 0.5.20's store loader takes no
layout (their store.cuh writes the V4 layout only, at the same offsets), and 0.5.19's c_plan.cuh predates the request
ring (`use_req_ring`, 0.5.20 on), so its planner module takes every argument but that one
(`_CompressPlanModuleWithoutRequestRing`).

`install()` patches the loaders only where no CUDA device is visible: on a GPU host the real JIT kernels load.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import types

import torch

_CSRC = "sglang 0.5.23: sglang/kernels/jit/csrc/deepseek_v4/"
OPS = (
    ("sglang.kernels.ops.attention.dsv4.attn._jit_fused_store_module (flashmla, V4): run",
     _CSRC + "store.cuh (fused_store_flashmla_cache, FusedStoreCacheFlashMLAKernel); "
     "sgl_kernel/deepseek_v4/kv_layout.cuh (PagedKV<V4>); sgl_kernel/deepseek_v4/fp8_utils.cuh (cast_to_ue8m0)"),
    ("sglang.kernels.ops.attention.dsv4.compress._jit_compress_plan_module: plan_prefill",
     _CSRC + "c_plan.cuh (plan_compress_prefill, CPU-input path; plan_compress_prefill_kernel_1); "
     "sgl_kernel/deepseek_v4/compress_v2.cuh (CompressPlan, WritePlan)"),
    ("sglang.kernels.ops.attention.dsv4.compress._jit_compress_plan_module: plan_decode",
     _CSRC + "c_plan.cuh (plan_compress_decode, plan_compress_decode_kernel); "
     "sgl_kernel/deepseek_v4/compress_v2.cuh (DecodePlan)"),
)

# -- the V4 FP8 store -------------------------------------------------------------------------------------

V4_NOPE, V4_ROPE, V4_TILE = 448, 64, 64
V4_TILES = V4_NOPE // V4_TILE
V4_DATA_BYTES = V4_NOPE + 2 * V4_ROPE  # 576
V4_SCALE_BYTES = V4_TILES + 1  # 8
FP8_MAX = 448.0
SCALE_EPS = 1e-4


def v4_page_bytes(page_size: int) -> int:
    """`kv_page_bytes<V4>`: page_size * 584 bytes, padded to a multiple of 576."""
    return -(-page_size * (V4_DATA_BYTES + V4_SCALE_BYTES) // V4_DATA_BYTES) * V4_DATA_BYTES


def _ue8m0(scale: torch.Tensor) -> torch.Tensor:
    """`cast_to_ue8m0`: the float32's biased exponent, plus one when its mantissa is non-zero (int32)."""
    bits = scale.contiguous().view(torch.int32)
    return ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(torch.int32)


def fused_store_flashmla_v4(input: torch.Tensor, cache: torch.Tensor, indices: torch.Tensor, page_size: int) -> None:
    """`FusedStoreCacheFlashMLAKernel<Float, IndexT, page_size, V4>::run`: quantize `input` [n, 512] (bf16, fp16
    or fp32) into the uint8 page buffer `cache` [pages, page_bytes] at `indices` [n] (int32 or int64)."""
    if input.ndim != 2 or input.shape[1] != V4_NOPE + V4_ROPE:
        raise ValueError(f"fused_store stand-in: input must be [num_tokens, 512], got {tuple(input.shape)}")
    if input.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"fused_store stand-in: input dtype {input.dtype} is not a float the kernel takes")
    if indices.ndim != 1 or indices.shape[0] != input.shape[0] or indices.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"fused_store stand-in: indices must be [{input.shape[0]}] int32/int64, "
                         f"got {tuple(indices.shape)} {indices.dtype}")
    page_bytes = v4_page_bytes(page_size)
    if cache.dtype != torch.uint8 or cache.ndim != 2 or cache.stride() != (page_bytes, 1):
        raise ValueError(f"fused_store stand-in: cache must be uint8 [pages, {page_bytes}] with strides "
                         f"({page_bytes}, 1), got {cache.dtype} {tuple(cache.shape)} {cache.stride()}")
    if page_size & (page_size - 1):
        raise ValueError(f"fused_store stand-in: page_size {page_size} is not a power of two")
    n = input.shape[0]
    if n == 0:
        return
    loc = indices.long()
    capacity = cache.shape[0] * page_size
    bad = (loc < 0) | (loc >= capacity)
    if bool(bad.any()):
        raise ValueError(f"fused_store stand-in: indices outside [0, {capacity}) at rows {bad.nonzero()[:4].view(-1).tolist()}"
                         " (the kernel would write out of bounds)")
    x = input.float()
    tiles = x[:, :V4_NOPE].view(n, V4_TILES, V4_TILE)
    amax = tiles.abs().amax(dim=-1)
    scale_raw = torch.clamp(amax, min=torch.tensor(SCALE_EPS, dtype=torch.float32)) / FP8_MAX
    exp = _ue8m0(scale_raw)  # [n, 7] in 0..255
    inv_scale = ((254 - exp) << 23).to(torch.int32).view(torch.float32)  # 1 / 2^(exp - 127), exact
    nope = (tiles * inv_scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    rope = x[:, V4_NOPE:].to(torch.bfloat16)

    page, slot = loc // page_size, loc % page_size
    pages = cache.shape[0]
    data_rows = cache[:, : page_size * V4_DATA_BYTES].view(pages, page_size, V4_DATA_BYTES)
    scale_at = page_size * V4_DATA_BYTES
    scale_rows = cache[:, scale_at: scale_at + page_size * V4_SCALE_BYTES].view(pages, page_size, V4_SCALE_BYTES)
    data = torch.cat([nope.reshape(n, V4_NOPE).view(torch.uint8), rope.view(torch.uint8).view(n, 2 * V4_ROPE)], dim=1)
    data_rows[page, slot] = data
    scale_rows[page, slot, :V4_TILES] = exp.to(torch.uint8)


class _FusedStoreModule:
    """What `_jit_fused_store_module("flashmla", dtype, index_dtype, page_size, V4)` returns: its `run`."""

    def __init__(self, page_size: int):
        self.page_size = page_size

    def run(self, input: torch.Tensor, cache: torch.Tensor, indices: torch.Tensor) -> None:
        fused_store_flashmla_v4(input, cache, indices, self.page_size)


def _fused_store_module(name, input_dtype, index_dtype, page_size, layout=None):
    """`layout` None: 0.5.19's and 0.5.20's loader takes none, their store.cuh writing the V4 layout only (the same
    page, row and scale offsets as 0.5.23's `PagedKV<V4>`)."""
    v4 = layout is None or layout is importlib.import_module("sglang.kernels.ops.attention.dsv4.kv_layout").KVLayout.V4
    if name != "flashmla" or not v4:
        raise NotImplementedError(f"fused_store stand-in: only the flashmla V4 store is stood in, not {name} {layout}")
    return _FusedStoreModule(page_size)


# -- the compressor's prefill plan -------------------------------------------------------------------------

PLAN_C_BYTES, PLAN_W_BYTES = 16, 8
_U32_MAX = 0xFFFFFFFF


def _as_u32_bytes(fields: list[tuple[int, ...]], width: int) -> torch.Tensor:
    """Rows of 32-bit fields (each taken modulo 2**32, as the struct stores it) as little-endian bytes."""
    values = torch.tensor(fields, dtype=torch.int64).view(-1, width) & _U32_MAX
    as_i32 = torch.where(values >= 1 << 31, values - (1 << 32), values).to(torch.int32).contiguous()
    return as_i32.view(torch.uint8).view(values.shape[0], 4 * width)


def _plan_c_rows(rows: list[tuple[int, int, int, int, int]]) -> torch.Tensor:
    """CompressPlan {u32 seq_len, u16 ragged_id, u16 buffer_len, i32 read_page_0, i32 read_page_1}: 16 bytes."""
    return _as_u32_bytes([(s, (r & 0xFFFF) | (b & 0xFFFF) << 16, p0, p1) for s, r, b, p0, p1 in rows], 4)


def _plan_w_rows(rows: list[tuple[int, int]]) -> torch.Tensor:
    """WritePlan {u32 ragged_id, i32 write_loc}: 8 bytes."""
    return _as_u32_bytes(rows, 2)


INVALID_C = (_U32_MAX, 0, 0, -1, -1)
INVALID_W = (_U32_MAX, -1)


def _check_plan_inputs(req_pool_indices, req_to_token, full_to_state, seq_lens, extend_lens, pin_buffer,
                       num_q_tokens: int, compress_ratio: int, swa_page_size: int, ring_size: int,
                       use_req_ring: bool) -> None:
    """The checks c_plan.cuh makes before it plans (dtypes, the host-input path, the ratio, the bounds, the pinned
    buffer's size): a call the kernel refuses is refused here too."""
    for name, t, dtype in (("req_pool_indices", req_pool_indices, torch.int64), ("req_to_token", req_to_token, torch.int32),
                           ("full_to_state", full_to_state, torch.int64), ("seq_lens", seq_lens, torch.int64),
                           ("extend_lens", extend_lens, torch.int64), ("pin_buffer", pin_buffer, torch.uint8)):
        if t.dtype != dtype:
            raise ValueError(f"plan_compress_prefill stand-in: {name} must be {dtype}, got {t.dtype}")
    if not (seq_lens.is_cpu and extend_lens.is_cpu):
        raise NotImplementedError("plan_compress_prefill stand-in: only the host-input path (seq_lens and extend_lens "
                                  "on the CPU) is stood in")
    batch_size = req_pool_indices.shape[0]
    if compress_ratio not in (4, 128) or (use_req_ring and compress_ratio != 4):
        raise ValueError(f"plan_compress_prefill stand-in: compress_ratio {compress_ratio}, use_req_ring {use_req_ring}")
    if not (batch_size < 65536 and batch_size <= num_q_tokens <= 65536):
        raise ValueError(f"plan_compress_prefill stand-in: batch_size {batch_size}, num_q_tokens {num_q_tokens}")
    if swa_page_size % ring_size or ring_size % compress_ratio:
        raise ValueError(f"plan_compress_prefill stand-in: swa_page_size {swa_page_size}, ring_size {ring_size}")
    if pin_buffer.numel() < num_q_tokens * (PLAN_C_BYTES + PLAN_W_BYTES):
        raise ValueError("plan_compress_prefill stand-in: pin_buffer too small")


def _state_ring(req_to_token, full_to_state, compress_ratio: int, swa_page_size: int, ring_size: int,
                use_req_ring: bool):
    """c_plan.cuh's state-ring slot of a request row's position, as both planners translate it: `rid * ring +
    position % ring` for c128 or a request ring (`compute_req_ring_loc`), else the position's SWA slot through
    `req_to_token` and `full_to_state`, paged into the ring (`compute_loc`). Returns `slot(rid, position)`."""
    def slot(rid: int, position: int) -> int:
        if compress_ratio == 128 or use_req_ring:
            return rid * ring_size + position % ring_size
        swa_loc = int(full_to_state[int(req_to_token[rid, position])])
        return swa_loc // swa_page_size * ring_size + swa_loc % ring_size

    return slot


def plan_compress_prefill(req_pool_indices, req_to_token, full_to_state, seq_lens, extend_lens, pin_buffer,
                          num_q_tokens: int, compress_ratio: int, swa_page_size: int, ring_size: int,
                          use_req_ring: bool, use_cuda_graph: bool):
    """`plan_compress_prefill` (c_plan.cuh): (plan_c [n_c, 16], plan_w [n_w, 8]) uint8 on `req_to_token`'s device.
    Reads `req_to_token` and `full_to_state` (c4 on a paged ring only). The host-input path; with `use_cuda_graph`,
    also the device-input path's padding of a bucket the extends underfill (kernel0: valid entries, then invalid
    ones up to num_q_tokens; the order of the valid entries, an atomic counter's there, is the host loop's)."""
    _check_plan_inputs(req_pool_indices, req_to_token, full_to_state, seq_lens, extend_lens, pin_buffer, num_q_tokens,
                       compress_ratio, swa_page_size, ring_size, use_req_ring)
    batch_size = req_pool_indices.shape[0]
    is_overlap = compress_ratio == 4
    window_size = compress_ratio * (2 if is_overlap else 1)
    mtp_pad = ring_size - window_size + 2 if ring_size > window_size else 0
    seqs, exts = seq_lens.tolist(), extend_lens.tolist()
    rids = req_pool_indices.tolist()

    plan_c: list[tuple] = []
    plan_w: list[tuple] = []  # (ragged_id, batch_id, position + 1) before translation
    counter = 0
    for i in range(batch_size):
        seq_len, extend_len = int(seqs[i]), int(exts[i])
        prefix_len = seq_len - extend_len
        last_c_pos = seq_len // compress_ratio * compress_ratio
        first_w_pos = min(last_c_pos - (compress_ratio if is_overlap else 0), seq_len - mtp_pad)
        if not 0 < extend_len <= seq_len:
            raise ValueError(f"plan_compress_prefill stand-in: request {i}: extend_len {extend_len}, seq_len {seq_len}")
        for j in range(extend_len):
            position = prefix_len + j
            ragged = counter + j
            if (position + 1) % compress_ratio == 0:
                plan_c.append((position + 1, ragged, window_size - min(j + 1, window_size), -1, i))
            if position >= first_w_pos or (is_overlap and not use_req_ring
                                            and position % swa_page_size >= swa_page_size - compress_ratio):
                plan_w.append((ragged, i, position + 1))
        counter += extend_len
    # The host-input path checks `counter == num_q_tokens`; the device-input path (kernel0), which SGLang's graph plan
    # takes on a GPU (its lengths on the device, `use_cuda_graph`), pads an underfilled bucket's [counter, num_q)
    # with invalid entries instead. On the simulator every tensor is a host tensor, so a graph's plan arrives here.
    if counter > num_q_tokens or (counter != num_q_tokens and not use_cuda_graph):
        raise ValueError(f"plan_compress_prefill stand-in: the extends cover {counter} tokens, num_q_tokens is {num_q_tokens}")

    # plan_compress_prefill_kernel_1: the state-ring translation.
    state_loc = _state_ring(req_to_token, full_to_state, compress_ratio, swa_page_size, ring_size, use_req_ring)
    final_c = []
    for seq_len, ragged, buffer_len, page0, batch_id in plan_c:
        if buffer_len > 0:
            rid = rids[batch_id]
            position_1 = seq_len - 1
            position_0 = max(position_1 - compress_ratio, 0)
            page0, page1 = state_loc(rid, position_0) // compress_ratio, state_loc(rid, position_1) // compress_ratio
        else:
            page1 = batch_id
        final_c.append((seq_len, ragged, buffer_len, page0, page1))
    final_w = [(ragged, state_loc(rids[batch_id], seq1 - 1)) for ragged, batch_id, seq1 in plan_w]
    if use_cuda_graph:
        final_c += [INVALID_C] * (num_q_tokens - len(final_c))
        final_w += [INVALID_W] * (num_q_tokens - len(final_w))
    device = req_to_token.device
    return _plan_c_rows(final_c).to(device), _plan_w_rows(final_w).to(device)


def _plan_d_rows(rows: list[tuple[int, int, int, int]]) -> torch.Tensor:
    """DecodePlan {u32 seq_len, i32 write_loc, i32 read_page_0, i32 read_page_1}: 16 bytes."""
    return _as_u32_bytes(rows, 4)


def plan_compress_decode(req_pool_indices, req_to_token, full_to_state, seq_lens, compress_ratio: int,
                         swa_page_size: int, ring_size: int, use_req_ring: bool) -> torch.Tensor:
    """`plan_compress_decode` (c_plan.cuh, `plan_compress_decode_kernel`): one DecodePlan per request, [batch, 16]
    uint8 on `req_to_token`'s device. The request's last position (`seq_len - 1`) is written to its state-ring slot
    and the compressor reads the ring pages of that position and of the one `compress_ratio` before it (at least 0):
    through `req_to_token` and `full_to_state` (c4 on a paged ring), or `rid * ring + position % ring` (c128, or a
    request ring)."""
    if compress_ratio not in (4, 128) or (use_req_ring and compress_ratio != 4):
        raise ValueError(f"plan_compress_decode stand-in: compress_ratio {compress_ratio}, use_req_ring {use_req_ring}")
    state_loc = _state_ring(req_to_token, full_to_state, compress_ratio, swa_page_size, ring_size, use_req_ring)
    rows = []
    for rid, seq_len in zip(req_pool_indices.tolist(), seq_lens.tolist()):
        position_1 = int(seq_len) - 1
        write_loc = state_loc(rid, position_1)
        page_0 = state_loc(rid, max(position_1 - compress_ratio, 0)) // compress_ratio
        rows.append((int(seq_len), write_loc, page_0, write_loc // compress_ratio))
    return _plan_d_rows(rows).to(req_to_token.device)


class _CompressPlanModule:
    """What `_jit_compress_plan_module()` returns: `plan_prefill` and `plan_decode` stood in, the rest refused."""

    plan_prefill = staticmethod(plan_compress_prefill)
    plan_decode = staticmethod(plan_compress_decode)

    @staticmethod
    def _not_stood_in(name):
        def refuse(*args, **kwargs):
            raise NotImplementedError(f"compress plan stand-in: {name} is not stood in (not on the eager prefill path)")
        return refuse

    plan_prefill_legacy = _not_stood_in.__func__("plan_prefill_legacy")
    plan_decode_legacy = _not_stood_in.__func__("plan_decode_legacy")


class _CompressPlanModuleWithoutRequestRing(_CompressPlanModule):
    """0.5.19's module: its c_plan.cuh predates the request ring (0.5.20 added `use_req_ring`), so its entry points
    take every argument but that one and plan as `use_req_ring=False` does."""

    @staticmethod
    def plan_prefill(*args):
        *planned, use_cuda_graph = args
        return plan_compress_prefill(*planned, False, use_cuda_graph)

    @staticmethod
    def plan_decode(*args):
        return plan_compress_decode(*args, False)


@functools.lru_cache(maxsize=1)
def _compress_plan_module():
    """The stand-in module of the installed release's c_plan.cuh: its Python wrapper passes `use_req_ring` from
    0.5.20 on."""
    generate = importlib.import_module(_COMPRESS).CompressorPrefillPlan.generate
    if "use_req_ring" in inspect.signature(generate).parameters:
        return _CompressPlanModule()
    return _CompressPlanModuleWithoutRequestRing()


class _UnpinnedTorch(types.ModuleType):
    """`torch` as `compress.py` sees it on a host without CUDA: `empty(..., pin_memory=True)` allocates plain
    host memory (pinning needs a CUDA driver); everything else is torch's own."""

    def __init__(self):
        super().__init__("torch")

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def empty(*args, **kwargs):
        kwargs.pop("pin_memory", None)
        return torch.empty(*args, **kwargs)


_ATTN = "sglang.kernels.ops.attention.dsv4.attn"
_COMPRESS = "sglang.kernels.ops.attention.dsv4.compress"
_saved: dict = {}


def install() -> list[str]:
    """Patch the JIT loaders above (and compress.py's pinned allocation) where no CUDA device is visible;
    returns the names patched (empty on a GPU host). Idempotent; `uninstall()` restores SGLang's own."""
    if torch.cuda.is_available():
        return []
    attn, compress = importlib.import_module(_ATTN), importlib.import_module(_COMPRESS)
    patches = {(attn, "_jit_fused_store_module"): _fused_store_module,
               (compress, "_jit_compress_plan_module"): _compress_plan_module,
               (compress, "torch"): _UnpinnedTorch()}
    for (module, name), value in patches.items():
        _saved.setdefault((module, name), getattr(module, name))
        setattr(module, name, value)
    return [f"{module.__name__}.{name}" for module, name in patches]


def uninstall() -> None:
    for (module, name), value in _saved.items():
        setattr(module, name, value)
    _saved.clear()
