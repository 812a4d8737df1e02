"""A breakable prefill-graph replay (the `bcg` contract, DSV4's captured metadata) of SGLang 0.5.23 through the
real DSV4 backend: SGLang captures the bucket and plans its metadata, the harness keeps what a CUDA graph keeps.

What runs, all SGLang's own code (`prefill_cuda_graph_runner.py` unless named):

- capture, every bucket at start-up: `PrefillCudaGraphRunner.capture_one_shape` -> `capture_prepare` (the dummy batch over
  the runner's static buffers and registry slots, SGLang's `TboCudaGraphRunnerPlugin`, the translator's
  `bind_runner_slots`) -> `_init_forward_metadata_for_capture` -> the backend's
  `init_forward_metadata_for_breakable_cuda_graph_capture` (the bucket's metadata, kept by the runner in
  `attn_metadata_buffers`) -> the graph backend's `capture_one`;
- replay: `load_batch` -> `_prepare_forward_metadata_for_replay` -> the backend's
  `prepare_forward_metadata_for_breakable_cuda_graph_replay` (the captured metadata refreshed in place from a
  fresh plan of the static batch, the SWA write locations re-translated into it) and its resolver; then
  `_execute_body_capture` -> the graph backend's `replay`, which runs the body: per layer the captured segments
  and, as the breakable graph's eager segment, the backend's own `forward` over the captured metadata.

The harness's, and why: the graph backend's `capture_one` (there is no model to warm up and record, so nothing of
`run_once` runs) keeps what a CUDA graph of the body would hold: the bucket's static model inputs (the compressed
latents and indexer keys the harness's model makes) and the captured metadata's tensors as they were bound at
capture (`bound_at_capture`). The captured segments (each layer's compressor store and indexer top-k,
`eager.EagerPath`) read those, as captured kernels read the addresses they were recorded with: a refresh that
re-binds a field instead of copying into it leaves them reading the capture's tensor, as on a GPU.

SGLang captures every bucket at start-up, in the runner's `__init__` (`graph_runner.SglangPrefillGraphRunner`),
before any request: the capture's host work (it reads the dummy batch's rows of the request table) is not
observed, since at start-up it cannot race with anything.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch

# Nested objects of the metadata a captured segment reads through (DSV4Metadata -> DSV4AttnMetadata,
# the indexer's metadata, the compressor plans): copied down to this depth, their tensors kept by reference.
_CAPTURE_DEPTH = 3


def bound_at_capture(value: Any, depth: int = _CAPTURE_DEPTH) -> Any:
    """`value` as a captured graph holds it: every object down to `depth` copied (so a later re-binding of one
    of its fields is not seen), every tensor the same tensor (so an in-place refresh of it is)."""
    if depth == 0 or isinstance(value, (torch.Tensor, type)) or not hasattr(value, "__dict__"):
        return value
    held = copy.copy(value)
    for name, field in vars(value).items():
        if hasattr(field, "__dict__") and not isinstance(field, (torch.Tensor, type)) and not callable(field):
            object.__setattr__(held, name, bound_at_capture(field, depth - 1))
    return held


@dataclasses.dataclass
class CapturedBucket:
    """What the captured graph of one bucket holds: the captured metadata as bound at capture, and the static
    model inputs (the harness model's compressed latents and indexer keys for the bucket's rows); with HiSparse,
    `c4_device_indices`: the tensor the capture's indexer re-bound the captured metadata's c4 page indices to
    (`RealGraphs.captured`), which the graph's translation writes on every replay."""

    metadata: Any
    compressed_new: torch.Tensor | None = None
    index_k_new: torch.Tensor | None = None
    c4_device_indices: torch.Tensor | None = None


def bucket_of(shape_key) -> int:
    """A bucket's token count from the key SGLang names it by: a ShapeKey (0.5.21 on) or the count itself (0.5.19 and
    0.5.20 key their replays and captured metadata by it)."""
    return getattr(shape_key, "size", shape_key)


class RealGraphs:
    """The real-backend buckets of one session's breakable prefill-graph runner. `runner`: SGLang's
    `PrefillCudaGraphRunner` object the session drives; `model_runner`: the session's model runner."""

    def __init__(self, runner, model_runner):
        self.runner, self.mr = runner, model_runner
        self.buckets: dict[int, CapturedBucket] = {}

    def ensure(self, bucket: int, padded) -> CapturedBucket:
        """The bucket as SGLang's start-up capture kept it; its static inputs sized from `padded` (the live batch
        padded to the bucket) when first replayed. A bucket the runner never captured is the harness's error: the
        runner was built to capture every bucket the case's graph batches pad to."""
        held = self.buckets.get(bucket)
        if held is None:
            raise RuntimeError(f"SGLang's replay asked for bucket {bucket}, which its start-up capture did not capture "
                               f"(captured: {sorted(self.buckets)})")
        if held.compressed_new is None:
            held.compressed_new = torch.zeros_like(padded.compressed_new)
            held.index_k_new = torch.zeros_like(padded.index_k_new)
        return held

    def captured(self, shape_key) -> None:
        """The graph backend's `capture_one`: the metadata SGLang just planned for the bucket, as captured. With
        HiSparse, what the capture's run of the indexer leaves behind too: its HiSparse step (`forward_c4_indexer`,
        outside a decode) re-binds the metadata's `c4_sparse_page_indices` to the translation's output, a tensor
        of the graph's own; the captured metadata keeps it (the replay's refresh neither copies nor re-binds that
        field: "produced in-graph before the attention graph break reads it"), so the attention of every replay
        reads there, and the graph's captured top-k still writes the tensor the capture bound."""
        planned, bucket = self.runner.attn_metadata_buffers or {}, bucket_of(shape_key)
        metadata = planned.get(shape_key, planned.get(bucket))  # 0.5.19 keys it by the token count, not the ShapeKey
        if metadata is None:
            raise RuntimeError(f"capture of {shape_key}: SGLang planned no captured metadata for it")
        held = CapturedBucket(bound_at_capture(metadata))
        if self.mr.eager.real.hisparse:
            self.capture_hisparse_indexer(held, metadata)
        self.buckets[bucket] = held

    def capture_hisparse_indexer(self, held: CapturedBucket, metadata) -> None:
        """The capture's HiSparse indexer step (`captured`): the metadata's c4 page indices re-bound to their
        translation, which the bucket keeps as the tensor every replay's translation writes."""
        core = metadata.core_attn_metadata
        if core.c4_sparse_page_indices is None:  # no c4 layer
            return
        held.c4_device_indices = self.mr.eager.real.pool.c4_kv_pool.translate_loc_to_hisparse_device(
            core.c4_sparse_page_indices).to(torch.int32)
        core.c4_sparse_page_indices = held.c4_device_indices

    def load_inputs(self, bucket: int, padded) -> None:
        load_static_inputs(self.mr.harness_device, self.buckets[bucket], padded)


def load_static_inputs(device, held, padded) -> None:
    """`load_batch`'s copy of the model's inputs (`padded`'s compressed latents and indexer keys) into a bucket's
    static buffers (`held`'s, a captured graph's), launched on the current stream (the forward stream)."""

    def load():
        held.compressed_new.copy_(padded.compressed_new)
        held.index_k_new.copy_(padded.index_k_new)

    device.launch("load_batch.static_inputs", load, writes={"static_inputs": None})


__all__ = ["CapturedBucket", "RealGraphs", "bound_at_capture", "bucket_of", "load_static_inputs"]
