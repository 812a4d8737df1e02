"""Sparse attention on the GPU: a Triton twin of `harness.kernels.torch_attention.sparse_attention`.

Same signature and semantics (q [T, H, D], one latent kv head [N, D] where K equals V, index rows
[T, W] with -1 = skip, a per-head sink that joins the softmax as a virtual key of value 0), fp32
accumulation, and bit-reproducible output (fixed tile order, no atomics), which the harness's
bit-exact oracle against the barriered run relies on.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from harness.device import DeviceKind
from harness.errors import EnvironmentBroken, InvalidArgument
from harness.kernels.torch_attention import sparse_attention

MAX_HEAD_DIM = 512
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
INDEX_DTYPES = (torch.int32, torch.int64)


@dataclass(frozen=True)
class KernelConfig:
    """Tile sizes and launch shape. Part of the result's bits: a different BLOCK_W sums in a
    different order, so a config is chosen from the sizes alone, never autotuned per run."""

    block_h: int
    block_w: int
    num_warps: int
    num_stages: int


# The tilings tried for DSV4's real heads (64 x 512, bf16): all fit one H100/H200 SM, with 8 warps
# so the [64, 512] fp32 accumulator spreads over two warp groups. The benchmark times them, the
# tests check each against float64 and for bit-reproducibility, and default_config takes the first:
# the fastest on an H200 at 8k tokens (2.73 ms; block_w 32: 3.68 ms, 32 / 3 stages: 4.0 ms,
# 16 / 4 stages: 6.1 ms; 32 heads per program on 4 warps: 3.55 ms).
CANDIDATES = (
    KernelConfig(64, 64, 8, 2), KernelConfig(64, 32, 8, 2), KernelConfig(64, 32, 8, 3), KernelConfig(64, 16, 8, 4),
)


@functools.cache
def _triton():
    try:
        import triton
    except ImportError:
        return None
    return triton


def available() -> bool:
    """Whether the Triton kernel can run here: Triton imports and a CUDA device is present."""
    return _triton() is not None and torch.cuda.is_available()


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _pow2(n: int, least: int = 16) -> int:
    return max(least, 1 << (n - 1).bit_length())


def default_config(heads: int, head_dim: int, dtype: torch.dtype) -> KernelConfig:
    """Tiles that fit an H100/H200 SM (228 KiB shared memory, 64K registers) at head_dim 512."""
    block_d = _pow2(head_dim)
    if dtype == torch.float32:
        return KernelConfig(block_h=16, block_w=16, num_warps=4, num_stages=1)
    block_h = min(64, _pow2(heads))
    if block_h == 64 and block_d == 512:
        return CANDIDATES[0]
    num_warps = 8 if block_h * block_d >= 64 * 256 else 4
    return KernelConfig(block_h=block_h, block_w=32 if block_d >= 256 else 64, num_warps=num_warps, num_stages=2)


def _check(q, kv, indices, sink, out) -> None:
    if q.dim() != 3:
        raise InvalidArgument(f"q.shape={tuple(q.shape)}: q must be [tokens, heads, head_dim]")
    tokens, heads, head_dim = q.shape
    if kv.dim() != 2 or kv.shape[1] != head_dim:
        raise InvalidArgument(f"kv.shape={tuple(kv.shape)}: kv must be [rows, {head_dim}] (q's head_dim)")
    if indices.dim() != 2 or indices.shape[0] != tokens:
        raise InvalidArgument(f"indices.shape={tuple(indices.shape)}: indices must be [{tokens}, width]")
    if tuple(sink.shape) != (heads,):
        raise InvalidArgument(f"sink.shape={tuple(sink.shape)}: sink must be [{heads}] (one per head)")
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise InvalidArgument(f"q.shape[2]={head_dim}: head_dim must be in 1..{MAX_HEAD_DIM}")
    if q.dtype not in DTYPES or kv.dtype != q.dtype:
        raise InvalidArgument(f"q.dtype={q.dtype}, kv.dtype={kv.dtype}: both must be one of "
                              f"{', '.join(map(str, DTYPES))}, and equal")
    if indices.dtype not in INDEX_DTYPES:
        raise InvalidArgument(f"indices.dtype={indices.dtype}: allowed torch.int32, torch.int64")
    if not sink.is_floating_point():
        raise InvalidArgument(f"sink.dtype={sink.dtype}: sink must be a floating-point tensor")
    named = {"q": q, "kv": kv, "indices": indices, "sink": sink}
    if out is not None:
        if tuple(out.shape) != tuple(q.shape) or out.dtype != q.dtype:
            raise InvalidArgument(f"out: shape {tuple(out.shape)} dtype {out.dtype}; must be "
                                  f"{tuple(q.shape)} {q.dtype} (q's)")
        if out.stride(-1) != 1:
            raise InvalidArgument(f"out.stride()={out.stride()}: the last dimension must be contiguous")
        named["out"] = out
    devices = {name: t.device for name, t in named.items()}
    if len(set(devices.values())) != 1:
        raise InvalidArgument(f"tensors on different devices: {devices}; all must share one device")
    device = q.device
    kind = DeviceKind.of(device)
    if kind is not DeviceKind.CUDA and not (kind is DeviceKind.CPU and _interpreting()):
        raise InvalidArgument(f"q.device={device}: the Triton kernel needs cuda tensors "
                              "(cpu only under TRITON_INTERPRET=1)")


def triton_sparse_attention(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sink: torch.Tensor,
                            scale: float, *, out: torch.Tensor | None = None,
                            config: KernelConfig | None = None) -> torch.Tensor:
    """q [T, H, D], kv [N, D], indices [T, W] (-1 = skip), sink [H] -> out [T, H, D] in q's dtype.

    A row whose entries are all -1 is the sink-only softmax: zeros. An index >= N is not read; it
    makes that row NaN, so a corrupted index row fails every oracle instead of faulting the device.
    """
    _check(q, kv, indices, sink, out)
    if _triton() is None:
        raise EnvironmentBroken("triton is not installed: the GPU sparse-attention kernel needs it "
                                "(pip install triton), or use harness.model.attention.sparse_attention")
    from harness.kernels._sparse_attention_kernel import sparse_attention_fwd

    q = q if q.stride(-1) == 1 else q.contiguous()
    kv = kv if kv.stride(-1) == 1 else kv.contiguous()
    indices = indices if indices.stride(-1) == 1 else indices.contiguous()
    sink = sink.contiguous()
    out = torch.empty_like(q) if out is None else out
    tokens, heads, head_dim = q.shape
    if tokens == 0:
        return out
    cfg = config or default_config(heads, head_dim, q.dtype)
    grid = (tokens, -(-heads // cfg.block_h))
    sparse_attention_fwd[grid](
        q, kv, indices, sink, out,
        heads, head_dim, indices.shape[1], kv.shape[0], float(scale) * 1.4426950408889634,
        q.stride(0), q.stride(1), kv.stride(0), indices.stride(0), out.stride(0), out.stride(1),
        BLOCK_H=cfg.block_h, BLOCK_W=cfg.block_w, BLOCK_D=_pow2(head_dim), STAGES=cfg.num_stages,
        IEEE_FP32=q.dtype == torch.float32,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out


def sparse_attention_for(device_type: str | torch.device) -> Callable[..., torch.Tensor]:
    """The sparse attention the model should call on this device: the Triton kernel on CUDA when it
    is available, else the plain torch implementation."""
    if DeviceKind.of(device_type) is DeviceKind.CUDA and available():
        return triton_sparse_attention
    return sparse_attention
