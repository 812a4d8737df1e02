"""GPU kernels of the harness, each with a plain-torch twin the model falls back to off CUDA."""

from harness.kernels.sparse_attention import (
    CANDIDATES,
    KernelConfig,
    available,
    default_config,
    sparse_attention_for,
    triton_sparse_attention,
)

__all__ = ["CANDIDATES", "KernelConfig", "available", "default_config", "sparse_attention_for", "triton_sparse_attention"]
