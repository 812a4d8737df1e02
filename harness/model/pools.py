"""Pools and the forward batch, as SGLang names them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from harness.device import DeviceKind
from harness.model.enums import ForwardMode, SpeculativeAlgorithm


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host data onto the device without a host sync: pinned memory, copied in stream order.

    A pageable copy would block the host until the stream drains, which on CUDA closes the very
    race window the delay opens.
    """
    if DeviceKind.of(device) is DeviceKind.CUDA:
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def staged(values, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return to_device(torch.tensor(values, dtype=dtype), device)


class ReqToTokenPool:
    """req_to_token [max_reqs, max_context] int32: request row -> full KV slot per position."""

    def __init__(self, max_reqs: int, max_context: int, device: torch.device):
        self.req_to_token = torch.zeros(max_reqs, max_context, dtype=torch.int32, device=device)


class DSV4TokenToKVPool:
    """Full slots, the smaller SWA slot space, and the caches keyed by them.

    `full_to_swa_index_mapping` is int64 [size + page_size + 1]: zero means the reserved dummy SWA
    slot 0 (alloc sets mapping[full] = swa, free clears to 0), and the trailing -1 maps -1 to -1.
    The compressed ("extra") caches of ratio 4 and 128 and the indexer cache are keyed by the full
    slot of a block's first token, reached through the page table.
    """

    request_window = None

    def __init__(self, size: int, page_size: int, swa_size: int, layers: int, head_dim: int, index_dim: int,
                 device: torch.device):
        self.size, self.page_size, self.swa_size = size, page_size, swa_size
        self.full_to_swa_index_mapping = torch.zeros(size + page_size + 1, dtype=torch.int64, device=device)
        self.full_to_swa_index_mapping[-1] = -1
        self.swa_kv = torch.zeros(layers, swa_size, head_dim, device=device)
        self.extra_kv = torch.zeros(layers, size, head_dim, device=device)
        self.indexer_k = torch.zeros(size, index_dim, device=device)
        # HiSparse translates full slots to its own device slots in every layer (identity when resident).
        self.full_to_hisparse = torch.arange(size, dtype=torch.int64, device=device)


@dataclass
class ForwardBatch:
    """The per-batch tensors (owned by the batch, read at metadata init) and the model's inputs."""

    forward_mode: ForwardMode
    spec_algorithm: SpeculativeAlgorithm
    batch_size: int
    req_pool_indices: torch.Tensor  # [R] int32
    seq_lens: torch.Tensor  # [R] int32
    seq_lens_cpu: list[int]
    extend_seq_lens: torch.Tensor  # [R] int32
    extend_seq_lens_cpu: list[int]
    extend_start_loc: torch.Tensor  # [R] int32
    positions: torch.Tensor  # [T] int64
    out_cache_loc: torch.Tensor  # [T] int64 full slots
    input_ids: torch.Tensor  # [T]
    req_pool_indices_cpu: list[int]  # host copy: which req_to_token rows the batch reads
    # model inputs standing for hidden states (not SGLang fields)
    q: torch.Tensor  # [layers, T, H, D]
    kv_new: torch.Tensor  # [layers, T, D] latents of the new tokens
    compressed_new: torch.Tensor  # [layers, T, D] compressed entry completed at this row (else 0)
    index_k_new: torch.Tensor  # [T, index_dim] indexer key of the block completed at this row
    q_index: torch.Tensor  # [T, index_dim]
    num_token_non_padded: Optional[int] = None
    row_req: list[int] = field(default_factory=list)  # host: request of each row (padded rows: the last)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])
