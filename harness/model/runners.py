"""The publisher, the eager runner, the prefill graph runner, and the model runner that owns them."""

from __future__ import annotations

import bisect
import itertools
from dataclasses import replace
from typing import Optional

import torch

from harness.model.attention import sparse_attention_on
from harness.model.backend import DeepseekV4AttnBackend, swa_window_indices
from harness.model.enums import ForwardMode, SharedReadEnds
from harness.model.metadata import DSV4Metadata
from harness.model.pools import ForwardBatch, staged
from harness.probe import Dispatch, GraphReplay, MetadataReuse, PlanKind, PlanRead, Publish
from harness.semantics import Semantics

_MAX_PREFILL_CUDA_GRAPH_PADDING_FACTOR = 2


def generate_prefill_cuda_graph_batch_sizes(max_bs: int) -> list[int]:
    """SGLang's default prefill buckets (aggregate token counts), capped at max_bs."""
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
             + list(range(576, 1025, 64)) + list(range(1280, 4097, 256)) + list(range(4608, max_bs + 1, 512)))
    return [s for s in sizes if s <= max_bs]


def generate_speculative_cuda_graph_batch_sizes(max_bs: int) -> list[int]:
    """SGLang's default capture list (request counts) of a speculative server's decode-side graphs, EAGLE's
    draft-extend graph among them ("less padding for smaller batch sizes"), capped at max_bs: every count to 8, then
    every other one, so a draft extend of 9 requests replays the bucket of 10 with one padded request."""
    sizes = (list(range(1, 9)) + list(range(10, 33, 2)) + list(range(40, 65, 4)) + list(range(72, 257, 8))
             + list(range(272, max_bs + 1, 16)))
    return [s for s in sizes if s <= max_bs]


# -- publication -------------------------------------------------------------------------------------

def maybe_publish_prefill_shared_read_done(model_runner, shared_read_ends: SharedReadEnds, device) -> None:
    """0.5.23: record the event on the current stream when the resolved ends allow it."""
    if shared_read_ends is not SharedReadEnds.PRE_REPLAY:
        return
    if not model_runner.spec_algorithm.supports_prefill_shared_read_done():
        return
    if model_runner.flags.offloads_kv():  # host/storage offload is ordered only behind the schedule stream
        return
    record_and_publish(model_runner, device)


def maybe_publish_prefill_shared_read_done_pr(model_runner, forward_batch: ForwardBatch, device) -> None:
    """PR-era publisher (#35947 as merged), plus the later KV-offload gate (see DESIGN.md)."""
    if not model_runner.flags.prefill_read_done_enabled(Semantics.PR):
        return
    if forward_batch.forward_mode is not ForwardMode.EXTEND:
        return
    spec = model_runner.spec_algorithm
    if not spec.is_none() and not spec.is_dflash_family():
        return
    if model_runner.attn_backend.shared_read_ends(forward_batch.forward_mode) is not SharedReadEnds.PRE_REPLAY:
        return
    if model_runner.flags.offloads_kv():
        return
    record_and_publish(model_runner, device)


def record_and_publish(model_runner, device) -> None:
    """Record the read-done event on the current stream and put it in the runner's mailbox for the scheduler."""
    read_done = device.record_event()
    model_runner.shared_read_done_event = read_done
    model_runner.probe.note(Publish(stream=device.current_stream.name, event=read_done.id))


# -- runners -------------------------------------------------------------------------------------------

class EagerRunner:
    def __init__(self, model_runner):
        self.model_runner = model_runner

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        mr = self.model_runner
        backend = mr.attn_backend
        if fb.forward_mode is ForwardMode.MIXED and not mr.flags.cp_active:
            # EagerRunner.execute of every release (0.5.19 on): a mixed batch is extend-shaped (decode tails
            # are 1-token extends), so it runs as EXTEND; CP keeps MIXED.
            fb = replace(fb, forward_mode=ForwardMode.EXTEND)
        backend.init_forward_metadata(fb)
        if not mr.semantics.resolves_read_ends:
            backend.prepare_prefill_shared_read_snapshot(fb, num_qo_tokens=len(fb.input_ids))
            mr.publish_pr(mr, fb, mr.device)
        else:
            ends = backend.resolve_prefill_shared_read_ends(fb, num_qo_tokens=len(fb.input_ids))
            mr.publish(mr, ends, mr.device)
        return mr.run_model(fb)


class PrefillGraphRunner:
    """Replays at the smallest bucket >= the token count, refusing beyond 2x padding.

    `contract="fresh"`: no captured-metadata contract; fresh metadata is copied into the bucket's
    static metadata and the snapshot is built at the padded count. `contract="bcg"`: DSV4's
    breakable-graph captured-metadata contract; refresh, no snapshot, so EXTEND stays UNKNOWN.
    The captured part of each layer is the store of compressed entries, which reads its out_loc
    tensors by address.
    """

    def __init__(self, model_runner, *, contract: str = "fresh", max_bs: int = 2048):
        self.model_runner = model_runner
        self.contract = contract
        self.capture_bs = generate_prefill_cuda_graph_batch_sizes(max_bs)
        self.static_metadata: dict[int, DSV4Metadata] = {}
        self.graphs: dict[int, list] = {}
        self.static_inputs: dict[int, ForwardBatch] = {}

    def _load_static_inputs(self, bucket: int, padded: ForwardBatch) -> None:
        """load_batch: the captured kernels read the bucket's static input buffers."""
        static = self.static_inputs[bucket]

        def load():
            static.compressed_new.copy_(padded.compressed_new)
            static.index_k_new.copy_(padded.index_k_new)

        self.model_runner.device.launch("load_batch.static_inputs", load, writes={"static_inputs": None})

    def _pad_to_bucket(self, num_tokens: int) -> Optional[int]:
        i = bisect.bisect_left(self.capture_bs, num_tokens)
        return self.capture_bs[i] if i < len(self.capture_bs) else None

    def can_run_graph(self, num_tokens: int) -> bool:
        bucket = self._pad_to_bucket(num_tokens)
        return bucket is not None and bucket <= _MAX_PREFILL_CUDA_GRAPH_PADDING_FACTOR * num_tokens

    def execute(self, fb: ForwardBatch) -> torch.Tensor:
        mr = self.model_runner
        bucket = self._pad_to_bucket(fb.num_tokens)
        padded = self._pad(fb, bucket)
        mr.probe.note(GraphReplay(bucket=bucket, tokens=fb.num_tokens))
        if bucket not in self.static_metadata:
            self._capture(bucket, padded)
        self._load_static_inputs(bucket, padded)
        static = self.static_metadata[bucket]
        if not mr.semantics.resolves_read_ends:
            self._prepare_forward_metadata_for_replay(padded, static)
            if self.contract == "fresh":
                mr.attn_backend.prepare_prefill_shared_read_snapshot(padded, num_qo_tokens=bucket)
            mr.publish_pr(mr, padded, mr.device)
        else:
            self._prepare_forward_metadata_for_replay(padded, static)
            ends = mr.attn_backend.resolve_prefill_shared_read_ends(
                padded, num_qo_tokens=bucket, build_snapshot=self.contract == "fresh")
            mr.publish(mr, ends, mr.device)
        out = mr.run_model(padded, store_compressed=lambda layer: mr.device.replay(self.graphs[bucket][layer]))
        return out[:, : fb.num_tokens]

    def _pad(self, fb: ForwardBatch, bucket: int) -> ForwardBatch:
        return pad_forward_batch(fb, bucket)

    def _capture(self, bucket: int, padded: ForwardBatch) -> None:
        mr = self.model_runner
        backend = mr.attn_backend
        # The bucket's own out_cache_loc: a batch that fills the bucket exactly would otherwise lend the
        # static metadata its per-batch tensor, and every later replay's copy_ would write into it.
        own = replace(padded, out_cache_loc=padded.out_cache_loc.clone())
        static = backend.metadata_cls(backend.build_core_metadata(own))
        self.static_metadata[bucket] = static
        self.static_inputs[bucket] = static_fb = replace(
            padded, compressed_new=padded.compressed_new.clone(), index_k_new=padded.index_k_new.clone())
        graphs = []
        for layer in range(len(mr.dims.layer_ratios)):
            with mr.device.capture(f"prefill_graph[{bucket}].layer{layer}") as graph:
                self._capture_layer(bucket, layer, static_fb, static)
            graphs.append(graph)
        self.graphs[bucket] = graphs

    def _capture_layer(self, bucket: int, layer: int, static_fb: ForwardBatch, static: DSV4Metadata) -> None:
        """What one layer's graph holds; on CUDA a real capture, so it must allocate nothing it keeps."""
        self.model_runner.attn_backend.store_compressed(static_fb, layer, static.core_attn_metadata)

    def _prepare_forward_metadata_for_replay(self, padded: ForwardBatch, static: DSV4Metadata) -> None:
        mr = self.model_runner
        backend = mr.attn_backend
        fresh = backend.metadata_cls(backend.build_core_metadata(padded))
        op = "metadata.copy_" if self.contract == "fresh" else "metadata.refresh_"

        def launch(fn):  # raw_out_loc is copied from the batch's own out_cache_loc
            mr.device.launch(op, fn, reads={"meta.fresh": None, "fb.out_cache_loc": None}, writes={"meta.static": None})

        if self.contract == "fresh":
            static.copy_(fresh, launch)
        else:
            static.refresh_for_breakable_cuda_graph_replay_(fresh, launch)
            dst, src = static.core_attn_metadata.swa_out_cache_loc, fresh.core_attn_metadata.swa_out_cache_loc
            mr.device.launch("metadata.swa_out_cache_loc.copy_", lambda: dst.copy_(src),
                             reads={"meta.fresh": None}, writes={"meta.static": None})
        mr.probe.note(MetadataReuse(cache_reset=static.sparse_prefill_cache is None,
                                    flag_reset=not static.prefill_shared_reads_snapshotted))
        backend.planned(PlanKind.METADATA, static)
        backend.forward_metadata = static


def pad_forward_batch(fb: ForwardBatch, bucket: int) -> ForwardBatch:
    """SGLang's padding: query position 0, out_cache_loc 0 (the dummy slot), the last request's row. A
    padded row runs the model on input id 0, so its KV latent is a real value (`PADDED_LATENT`), not
    zero: a padded row that writes into a slot other than the dummy one changes what that slot holds."""
    pad = bucket - fb.num_tokens
    if pad == 0:
        return replace(fb, num_token_non_padded=fb.num_tokens)

    def rows(t: torch.Tensor, value=0) -> torch.Tensor:
        extra = torch.full((pad, *t.shape[1:]), value, dtype=t.dtype, device=t.device)
        return torch.cat([t, extra])

    def layered(t: torch.Tensor, value=0.0) -> torch.Tensor:
        extra = torch.full((t.shape[0], pad, *t.shape[2:]), value, dtype=t.dtype, device=t.device)
        return torch.cat([t, extra], dim=1)

    return replace(
        fb, positions=rows(fb.positions), out_cache_loc=rows(fb.out_cache_loc, PADDED_OUT_CACHE_LOC),
        input_ids=rows(fb.input_ids), q=layered(fb.q), kv_new=layered(fb.kv_new, PADDED_LATENT),
        compressed_new=layered(fb.compressed_new), index_k_new=rows(fb.index_k_new), q_index=rows(fb.q_index),
        num_token_non_padded=fb.num_tokens, row_req=fb.row_req + [fb.row_req[-1]] * pad,
    )


PADDED_OUT_CACHE_LOC = 0  # PaddingPolicy.ZERO: padded rows write to the reserved dummy slot
PADDED_LATENT = 0.5  # the KV latent a padded row writes (the model's output for input id 0 stands for it)


class ModelRunner:
    """Owns the pools, the backend, both runners and the event mailbox the scheduler reads."""

    backend_cls = DeepseekV4AttnBackend
    eager_runner_cls = EagerRunner
    graph_runner_cls = PrefillGraphRunner
    publish = staticmethod(maybe_publish_prefill_shared_read_done)
    publish_pr = staticmethod(maybe_publish_prefill_shared_read_done_pr)

    def __init__(self, *, device, flags, semantics, spec_algorithm, dims, req_to_token_pool, token_to_kv_pool,
                 sink, probe, graph_contract="fresh"):
        self.device, self.flags, self.semantics = device, flags, semantics
        self.spec_algorithm, self.dims, self.sink, self.probe = spec_algorithm, dims, sink, probe
        self.req_to_token_pool, self.token_to_kv_pool = req_to_token_pool, token_to_kv_pool
        self.shared_read_done_event = None
        self.plan_numbers = itertools.count(1)  # one per planning of metadata or a chunk cache (`backend.planned`)
        self.attn_backend = self.backend_cls(self)
        self.eager_runner = self.eager_runner_cls(self)
        self.graph_runner = self.graph_runner_cls(self, contract=graph_contract)
        tdev = token_to_kv_pool.swa_kv.device
        self.draft_kv = torch.zeros(token_to_kv_pool.swa_size, dims.head_dim, device=tdev)

    def forward(self, fb: ForwardBatch, *, graph: bool) -> dict[str, torch.Tensor]:
        self.probe.note(Dispatch(mode=fb.forward_mode.name, tokens=fb.num_tokens))
        if fb.forward_mode.is_idle():
            return self.execute_idle()
        if graph and self.flags.has_prefill_graph and self.graph_runner.can_run_graph(fb.num_tokens):
            out = self.graph_runner.execute(fb)
        else:
            out = self.eager_runner.forward(fb)
        outputs = {"attention": out}
        outputs.update(self.run_speculative_tail(fb))
        return outputs

    def execute_idle(self) -> dict[str, torch.Tensor]:
        """EagerRunner._execute_idle of every release: an idle batch without rows drops the stale metadata (an SWA
        use-after-free otherwise), then the model's forward runs over no rows with what the backend holds."""
        self.attn_backend.forward_metadata = None
        self.probe.note(PlanRead(PlanKind.METADATA, getattr(self.attn_backend.forward_metadata, "plan", None)))
        return {}

    def run_model(self, fb: ForwardBatch, store_compressed=None) -> torch.Tensor:
        dims = self.dims
        out = torch.zeros(len(dims.layer_ratios), fb.num_tokens, dims.heads, dims.head_dim,
                          device=self.token_to_kv_pool.swa_kv.device)
        self.attn_backend.forward_layers(fb, out, store_compressed=store_compressed)
        return out

    def run_speculative_tail(self, fb: ForwardBatch) -> dict[str, torch.Tensor]:
        """What runs after target prefill: EAGLE-family draft extend re-reads the tables (a later
        reader); DFLASH-family draft KV inject writes at locations snapshotted before the event."""
        spec, dev = self.spec_algorithm, self.device
        core = self.attn_backend.forward_metadata.core_attn_metadata
        pool = self.token_to_kv_pool
        if spec.is_dflash_family():
            loc = core.swa_out_cache_loc[: fb.num_tokens].long()  # SGLang's metadata keeps it int32
            dev.launch("draft_kv_inject", lambda: self.draft_kv.index_copy_(0, loc, fb.kv_new[0]),
                       reads={"meta.swa_out_cache_loc": None}, writes={"draft_kv": None})
            return {"draft_kv": self.draft_kv}
        if not spec.is_eagle_family():
            return {}
        r2t, f2s = self.req_to_token_pool.req_to_token, pool.full_to_swa_index_mapping
        rows = fb.num_tokens
        row_req = staged(fb.row_req[:rows], torch.int64, r2t.device)
        indices = torch.empty(rows, self.dims.swa_window, dtype=torch.int64, device=r2t.device)
        draft_out = torch.zeros(rows, self.dims.heads, self.dims.head_dim, device=r2t.device)

        def draft_metadata():
            rpi = fb.req_pool_indices.long()[row_req]
            indices.copy_(swa_window_indices(r2t, f2s, rpi, fb.positions[:rows], self.dims.swa_window)[0])

        def draft_attention():
            draft_out.copy_(sparse_attention_on(r2t.device)(fb.q[0, :rows], pool.swa_kv[0], indices, self.sink[0],
                                             self.dims.head_dim ** -0.5))

        dev.launch("draft_extend.init_forward_metadata", draft_metadata,
                   reads={"req_to_token": frozenset(fb.req_pool_indices_cpu), "full_to_swa": None,
                          "fb.req_pool_indices": None, "fb.positions": None},
                   writes={"draft_meta": None})
        dev.launch("draft_extend.attention", draft_attention, reads={"swa_kv[0]": None, "draft_meta": None},
                   writes={"draft_out": None})
        return {"draft_extend": draft_out}
