"""DSV4 metadata: the private snapshots the layers read after the shared-read-done event.

`copy_` and `refresh_for_breakable_cuda_graph_replay_` follow the 0.5.23 field lists: a field that
captured graph kernels read by address must be copied in place; the rest may be reassigned. Both
drop the sparse prefill cache (and, PR-era, the snapshotted flag), so a replay never reuses another
batch's snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

Launch = Callable[[Callable[[], None]], None]


def launch_now(fn: Callable[[], None]) -> None:
    """The default `launch` of `copy_` and `refresh_`: run the copy on the host, at once."""
    fn()

LARGE_INDEXER_QUERY_THRESHOLD = 11673  # sglang dsv4/metadata.py (_LARGE_INDEXER_QUERY_THRESHOLD there)

# 0.5.23 DSV4AttnMetadata.copy_: copied in place, the rest reassigned.
COPY_IN_PLACE = (
    "raw_out_loc", "seq_lens_casual", "positions_casual", "c4_out_loc", "c128_out_loc",
    "c4_topk_lengths_raw", "c4_topk_lengths_clamp1", "c4_sparse_topk_lengths", "c128_topk_lengths_clamp1",
    "page_table", "swa_page_indices", "swa_topk_lengths", "c128_page_indices",
    "c4_sparse_page_indices", "c4_sparse_raw_indices",
)
COPY_REASSIGN = ("swa_out_cache_loc",)
# 0.5.23 refresh_for_breakable_cuda_graph_replay_: copied in place, reassigned, left alone (in-graph).
REFRESH_IN_PLACE = (
    "raw_out_loc", "seq_lens_casual", "positions_casual", "c4_out_loc", "c128_out_loc",
    "c4_topk_lengths_raw", "c4_topk_lengths_clamp1", "c4_sparse_topk_lengths",
)
REFRESH_REASSIGN = ("page_table", "swa_page_indices", "swa_topk_lengths", "c128_page_indices",
                    "c128_topk_lengths_clamp1")
# Left alone by refresh: c4_sparse_page_indices and c4_sparse_raw_indices, produced in-graph by the indexer.


@dataclass
class DSV4AttnMetadata:
    """The core metadata, one row per query token (padded rows included)."""

    page_size: int
    index_topk: int
    page_table: torch.Tensor  # [rows, pages] int32, gathered from req_to_token
    raw_out_loc: torch.Tensor  # a reference to the batch's out_cache_loc, as in SGLang
    seq_lens_casual: torch.Tensor  # [rows] int32, pos + 1
    positions_casual: torch.Tensor  # [rows] int64
    swa_page_indices: torch.Tensor  # [rows, W] int32 SWA slots through req_to_token and full_to_swa
    swa_topk_lengths: torch.Tensor  # [rows] int32
    swa_out_cache_loc: torch.Tensor  # [rows] int64 full_to_swa[out_cache_loc], translated once
    c4_out_loc: torch.Tensor  # [rows] int64 slot of the ratio-4 block this row completes, else -1
    c128_out_loc: torch.Tensor
    c4_topk_lengths_raw: torch.Tensor
    c4_topk_lengths_clamp1: torch.Tensor
    c4_sparse_topk_lengths: torch.Tensor
    c4_sparse_page_indices: torch.Tensor  # [rows, topk] produced by the indexer
    c4_sparse_raw_indices: torch.Tensor  # [rows, topk] request-local block ids
    c128_page_indices: torch.Tensor  # [rows, c128_max] all visible ratio-128 blocks
    c128_topk_lengths_clamp1: torch.Tensor
    row_req: list[int] = field(default_factory=list)  # host: request of each row

    def _check_scalars(self, other: "DSV4AttnMetadata") -> None:
        if (self.page_size, self.index_topk) != (other.page_size, other.index_topk):
            raise ValueError("metadata scalars differ: page_size/index_topk must match to copy")

    def copy_(self, other: "DSV4AttnMetadata", launch: Launch = launch_now) -> None:
        self._move(other, COPY_IN_PLACE, COPY_REASSIGN, launch)

    def refresh_for_breakable_cuda_graph_replay_(self, other: "DSV4AttnMetadata", launch: Launch = launch_now) -> None:
        self._move(other, REFRESH_IN_PLACE, REFRESH_REASSIGN, launch)

    def _move(self, other, in_place, reassign, launch: Launch) -> None:
        """Reassignment is a host pointer change (now); in-place copies are device work (launched)."""
        self._check_scalars(other)
        for name in reassign:
            setattr(self, name, getattr(other, name))
        self.row_req = other.row_req
        pairs = [(getattr(self, n), getattr(other, n)) for n in in_place]

        def copy():
            for dst, src in pairs:
                dst.copy_(src)

        launch(copy)


@dataclass
class SparsePrefillChunkCache:
    """The snapshot of the SWA gather: built once, read by every sparse layer."""

    num_qo_tokens: int
    num_real_rows: int
    swa_token_ids: torch.Tensor  # [total_swa] int32 SWA slots, full_to_swa[req_to_token[row, pos]]
    swa_offsets: list[int]  # [R + 1]
    swa_first_pos: list[int]
    swa_gather_lens: list[int]
    query_start_loc: list[int]
    query_pos: torch.Tensor  # [num_qo_tokens] int64, zero-padded
    c0_combined_indices: torch.Tensor  # [num_qo_tokens, ceil_align(W)] int32 into the SWA region
    c0_combined_lens: torch.Tensor  # [num_qo_tokens] int32; padded rows: all -1, length 0
    seq_lens_cpu: list[int]
    row_req: list[int]
    plan: Optional[int] = None  # the planning that built it (`harness.probe.Planned`)


@dataclass
class DSV4Metadata:
    core_attn_metadata: DSV4AttnMetadata
    sparse_prefill_cache: Optional[SparsePrefillChunkCache] = None
    late_layer_tail: None = None
    prefill_shared_reads_snapshotted: bool = False  # PR-era only
    plan: Optional[int] = None  # the latest planning that filled it (`harness.probe.Planned`)

    def copy_(self, other: "DSV4Metadata", launch: Launch = launch_now) -> None:
        self.core_attn_metadata.copy_(other.core_attn_metadata, launch)
        self.sparse_prefill_cache = None
        self.prefill_shared_reads_snapshotted = False

    def refresh_for_breakable_cuda_graph_replay_(self, other: "DSV4Metadata", launch: Launch = launch_now) -> None:
        self.core_attn_metadata.refresh_for_breakable_cuda_graph_replay_(other.core_attn_metadata, launch)
        self.sparse_prefill_cache = None
        self.prefill_shared_reads_snapshotted = False
