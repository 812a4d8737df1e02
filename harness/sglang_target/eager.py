"""An eager EXTEND, DECODE or TARGET_VERIFY batch of the sglang target through SGLang's real DSV4 backend, on the
harness's device.

SGLang's eager runner (`EagerRunner._execute_extend`) calls the backend's `init_forward_metadata`, then its
resolver (`resolve_prefill_shared_read_ends`, which may build the sparse-prefill chunk cache), publishes, and
runs the model, whose every attention layer calls the backend's `forward`. Here the backend, its metadata init,
its resolver and its forward are SGLang's own (`real_backend.RealDsv4`); the model above the backend is the
harness's. On the device:

- metadata init and the resolver are host work on the forward stream (`Device.host_work`), where the runner
  calls them: after what the stream was given before, and declaring the shared tables they read;
- each layer is up to three launches on the forward stream: the compressor's store of the compressed latents the
  harness's model made (ratio 4 and 128), the indexer's top-k (ratio 4: the harness's scores, SGLang's
  transform), and the backend's `forward` itself. In a breakable replay the layer's SWA store is a captured segment
  of its own (`store_cache`, as DSV4's model stores in its prepare step) and the forward is the model's graph
  attention op over the live rows (`_graph_op`). A launch declares what the real code is meant to read and
  write there; the observer sees what it really touches, so a read of a shared table a launch did not declare
  (a lazy chunk-cache build after the event, a per-layer translation through the live mapping) is an
  `undeclared-access` finding, with SGLang's line, and the tracker judges the observed access;
- a launched closure runs when the simulator reaches it, after the host code that issued it returned: it binds
  what SGLang's launch would have bound at issue (the metadata object, the layer's inputs) and re-enters the
  case's SGLang configuration, which the issuing code held.

The model's data is the world's, exact in DSV4's FP8 cache and bf16 (`world.held_by_kv_format`): q and the SWA
latent k go to the backend in bf16, the output comes back in bf16, and the KV cache reads back exactly what was
stored (`kv_state`, decoded by `real_backend.read_v4`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any, Optional
from unittest import mock

import torch

from harness.case import CP_SIZE
from harness.probe import Forward, LazyBuild, MetadataReuse, PlanKind
from harness.sglang_target import real_backend
from harness.sglang_target.platform import cp_rank, sglang_config, sglang_op, swa_window
from harness.sglang_target.real_graph import CapturedBucket
from harness.world import BatchWorld, kv_contents

# The tables the backend's chunk-cache build reads (`_build_sparse_prefill_chunk_cache` ->
# `SparsePrefillChunkCache.build` -> `build_swa_token_ids`), besides the batch's rows of req_to_token.
_BUILD_READS = ("full_to_swa", "fb.req_pool_indices", "fb.seq_lens", "fb.extend_seq_lens")
# What metadata init reads: the batch's rows of req_to_token, the mapping (the SWA page indices and write
# locations, the compressor's state ring), and the batch's lengths, pool rows and write locations.
_INIT_READS = ("full_to_swa", "fb.req_pool_indices", "fb.seq_lens", "fb.extend_seq_lens", "fb.out_cache_loc")
_TIE_BREAK = 1 << 16  # scores are small integers (|score| <= 64): score * 2^16 - block stays exact in float32


class EagerPath:
    """The session's eager EXTEND batches through `real_backend.RealDsv4`. `runner`: the session's model runner
    (its device, probe, case and SGLang API), or its draft runner (`SglangDraftRunner`: its declarations name the
    draft's metadata, chunk cache, output and pool, `draft_meta`, `draft_swa_kv[0]`, ...)."""

    def __init__(self, runner, real: real_backend.RealDsv4):
        self.mr, self.real = runner, real
        self.prefix = real.prefix
        self.api, self.case, self.device, self.probe = runner.api, runner.case, runner.harness_device, runner.probe
        self.harness_pool = runner.session.token_to_kv_pool  # the harness's indexer-K store lives there
        # A CP batch's plan of each CP rank, by rank (`init_forward_metadata`); None for a batch without CP.
        self.rank_metadata: Optional[tuple] = None

    @contextlib.contextmanager
    def sglang(self) -> Iterator[None]:
        """The case's SGLang configuration, the host switches and the case's SWA window: what SGLang's code
        reads while it runs (a launched closure runs after the issuing code left these)."""
        with sglang_config(self.api, self.case), real_backend.switches(self.api, cp=self.case.flags.cp_active), \
                swa_window(self.api, self.case.dims.swa_window):
            yield

    @contextlib.contextmanager
    def bound(self, metadata) -> Iterator[None]:
        """The backend's `forward_metadata` as it was when the closure was issued."""
        backend = self.real.backend
        saved, backend.forward_metadata = backend.forward_metadata, metadata
        try:
            yield
        finally:
            backend.forward_metadata = saved

    def _named(self, *names: str) -> dict:
        """The declarations' `names` for this path's own resources (the draft's carry its prefix)."""
        return dict.fromkeys(self.prefix + name for name in names)

    def _rows_read(self) -> frozenset:
        return frozenset(self.mr.live_batch.req_pool_indices_cpu)

    # -- the pools -----------------------------------------------------------------------------------

    def load(self, world: BatchWorld) -> None:
        """The prefix's KV as earlier forwards left it, written through SGLang's pool into emptied buffers:
        SWA latents at their SWA slots, each complete compressed block at its slot (the full slot of its
        first token // ratio)."""
        real, ratios = self.real, self.real.layer_ratios
        for buffer in real.buffers().values():
            buffer.view(torch.uint8).zero_()
        contents = kv_contents(world, after_forward=False)
        (swa_layers, swa_slots), swa_values = contents["swa_kv"]
        (extra_layers, full_slots), extra_values = contents["extra_kv"]
        for layer, ratio in enumerate(ratios):
            mine = swa_layers == layer
            real.write_swa(layer, swa_slots[mine], swa_values[mine])
            mine = extra_layers == layer
            if ratio and bool(mine.any()):
                real.write_compressed(layer, full_slots[mine] // ratio, extra_values[mine])

    def kv_state(self) -> dict[str, torch.Tensor]:
        """The KV after the forward in the harness's layout, decoded from SGLang's pool (the SWA cache by SWA slot,
        the compressed caches by the full slot of a block's first token), and the harness's indexer-K store."""
        full_size = self.harness_pool.size
        return {"swa_kv": self.real.read_swa(),
                "extra_kv": self.real.read_compressed(full_size, self.mr.session.hisparse_slots),
                "indexer_k": self.harness_pool.indexer_k}

    # -- SGLang's metadata init and resolver, as host work ----------------------------------------------

    def init_forward_metadata(self, forward_batch) -> None:
        """The backend's own `init_forward_metadata` (SGLang's eager runner calls it on the forward stream)."""
        reads = {"req_to_token": self._rows_read(), **dict.fromkeys(_INIT_READS)}
        init = type(self.real.backend).init_forward_metadata
        with self.device.host_work(f"{self.prefix}DeepseekV4AttnBackend.init_forward_metadata", reads=reads,
                                   writes=self._named("meta")), self.sglang():
            self.rank_metadata = None
            if self.api.is_cp_active(forward_batch):
                self.rank_metadata = self._init_every_rank(init, forward_batch)
            else:
                init(self.real.backend, forward_batch)
        for metadata in self.rank_metadata or (self.real.backend.forward_metadata,):
            self.mr.plans.planned(PlanKind.METADATA, metadata)

    def _init_every_rank(self, init, forward_batch) -> tuple:
        """A CP batch's plan of every CP rank, by rank. Each rank of a CP server runs the same metadata init at the
        same point of its own stream, over its own copy of the tables, and keeps the rows its rank owns
        (`DSV4AttnMetadata.apply_cp_reindex`). This process is rank 0 and stands in for its peers: it runs their init
        too, at the same point and over the same tables, so every token row of the batch comes from SGLang's plan
        of the rank that owns it. Rank 0 plans last: the backend keeps its plan, as rank 0's backend would."""
        backend, plans = self.real.backend, []
        for rank in reversed(range(CP_SIZE)):
            with cp_rank(self.api, rank):
                init(backend, forward_batch)
            plans.append(backend.forward_metadata)
        return tuple(reversed(plans))

    def prepare_bcg_replay(self, capture_metadata, forward_batch, *, static_forward_batch=None) -> None:
        """The backend's own `prepare_forward_metadata_for_breakable_cuda_graph_replay` (SGLang's replay prep calls
        it on the forward stream): a fresh plan of the static batch, refreshed into the bucket's captured
        metadata in place, the SWA write locations re-translated into it. What the reused metadata kept of an earlier
        replay is noted (the chunk cache, the snapshot flag: both must be reset), for the policy oracle."""
        reads = {"req_to_token": self._rows_read(), **dict.fromkeys(_INIT_READS)}
        prepare = type(self.real.backend).prepare_forward_metadata_for_breakable_cuda_graph_replay
        with self.device.host_work("DeepseekV4AttnBackend.prepare_forward_metadata_for_breakable_cuda_graph_replay",
                                   reads=reads, writes=self._named("meta")), self.sglang():
            prepare(self.real.backend, capture_metadata, forward_batch, static_forward_batch=static_forward_batch)
        self.probe.note(MetadataReuse(
            cache_reset=capture_metadata.sparse_prefill_cache is None,
            flag_reset=not getattr(capture_metadata, "prefill_shared_reads_snapshotted", False)))
        self.mr.plans.planned(PlanKind.METADATA, capture_metadata)

    def resolve(self, real_resolve, forward_batch, **kwargs):
        """The backend's own resolver, which may build the chunk cache: the snapshot's reads of the tables."""
        reads = {"req_to_token": self._rows_read(), **self._named("meta"), **dict.fromkeys(_BUILD_READS)}
        with self.device.host_work(f"{self.prefix}DeepseekV4AttnBackend.resolve_prefill_shared_read_ends",
                                   reads=reads, writes=self._named("cache")), self.sglang():
            return real_resolve(forward_batch, **kwargs)

    # -- the layers -------------------------------------------------------------------------------------

    def layers(self, fb, forward_batch, captured: CapturedBucket | None = None) -> torch.Tensor:
        """Every layer of the harness's model over SGLang's backend: [layers, tokens, heads, 512] bf16.
        `fb`: the harness's batch (the model's inputs); `forward_batch`: SGLang's, as its runner gives it.
        `captured`: in a breakable graph's replay, what the bucket's graph holds: its captured segments (the
        compressor store and the indexer) read that metadata and those static inputs; the eager segment is DSV4's
        attention op as the model calls it inside the breakable graph (`bcg_deepseek_v4_attention_with_output`):
        over the bucket's rows, it slices them to the batch's live token count, calls the backend's `forward` with
        the static batch (the backend's metadata as the replay's prep left it) and zeroes the padded rows."""
        backend, dims, ratios = self.real.backend, self.case.dims, self.real.layer_ratios
        # the rows the backend's forward runs: the live ones, where the graph's attention op slices the bucket
        rows = fb.num_tokens if captured is None else self.mr.live_batch.num_tokens
        out = torch.zeros(len(ratios), fb.num_tokens, dims.heads, dims.head_dim, dtype=torch.bfloat16,
                          device=self.device.torch_device)
        metadata = backend.forward_metadata  # bound at issue, as a launch binds its pointers
        ranks = self.rank_metadata if captured is None and self.api.is_cp_active(forward_batch) else None
        segments = _Segments(metadata, fb.compressed_new, fb.index_k_new) if captured is None else \
            _Segments(captured.metadata, captured.compressed_new, captured.index_k_new, graph=True,
                      c4_device_indices=captured.c4_device_indices)
        with self.sglang():
            sparse = self.mr.use_sparse_prefill(forward_batch, rows)
        self.probe.note(Forward(rows=rows, sparse=sparse))
        self.mr.plans.read(PlanKind.METADATA, metadata)
        builds = sparse and metadata.sparse_prefill_cache is None  # the first layer builds it lazily
        # A PR-era breakable replay keeps no SWA write locations in its captured metadata (they are "recomputed by
        # the recorded init_forward_metadata_in_graph op"): every layer's store translates the batch's
        # out_cache_loc through the live mapping (`get_swa_out_cache_loc`), by design. 0.5.23's replay prep
        # translates once, into the captured tensor; an eager plan always carries them.
        translates = captured is not None and metadata.core_attn_metadata.swa_out_cache_loc is None
        for layer, ratio in enumerate(ratios):
            if ratio:
                self._compressor(segments, layer, ratio)
            if ratio == 4:
                self._indexer(fb, forward_batch, segments, layer, ranks)
            if captured is not None:
                self._swa_store(segments, fb, forward_batch, layer, translates=translates)
            self._attention(fb, forward_batch, metadata, layer, ratio, out, sparse=sparse,
                            builds=builds and layer == 0, graph=captured is not None, ranks=ranks)
        return out

    def _swa_store(self, segments: "_Segments", fb, forward_batch, layer: int, *, translates: bool) -> None:
        """A breakable replay's store of the layer's SWA latents, a captured segment: DSV4's model stores them in its
        prepare step (`attn_backend.store_cache` over the static batch, the bucket's rows) and calls its graph
        attention op with `save_kv_cache=False`. The write locations are the captured metadata's (`translates`: a
        PR-era plan keeps none, so the store translates them through the live mapping)."""
        backend, k = self.real.backend, fb.kv_new[layer].to(torch.bfloat16)

        def store():
            with self.sglang(), self.bound(segments.metadata):
                backend.store_cache(layer, k, forward_batch)

        reads = self._named(*segments.reads)
        if translates:
            reads.update(dict.fromkeys(("full_to_swa", "fb.out_cache_loc")))
        self.device.launch(f"{segments.prefix}layer{layer}.store_cache", store, reads=reads,
                           writes=self._named(f"swa_kv[{layer}]"))

    def _compressor(self, segments: "_Segments", layer: int, ratio: int) -> None:
        """The compressed latents this batch completes (the harness's compressor output) stored through
        SGLang's pool at the rows and slots of SGLang's plan; a c4 layer also stores the indexer keys of those
        blocks in the harness's indexer-K store, keyed by the block's first full slot (4 x its c4 slot)."""
        real, metadata = self.real, segments.metadata
        latents, index_keys = segments.compressed_new[layer], segments.index_k_new
        indexer_k = self.harness_pool.indexer_k

        def store():
            with self.sglang(), self.bound(metadata):
                rows, loc = real.compressor_writes(ratio)
                real.write_compressed(layer, loc, latents[rows])
                if ratio == 4:
                    indexer_k.index_copy_(0, loc.long() * 4, index_keys[rows])

        writes = {**self._named(f"extra_kv[{layer}]"), **({"indexer_k": None} if ratio == 4 else {})}
        reads = self._named(*segments.reads)
        if ratio == 4 and real.hisparse:  # the c4 pool translates the slots to device slots (`set_key_buffer_fused`)
            reads["full_to_hisparse"] = None
        self.device.launch(f"{segments.prefix}layer{layer}.compressor.store", store, reads=reads, writes=writes)

    def _indexer(self, fb, forward_batch, segments: "_Segments", layer: int, ranks: Optional[tuple]) -> None:
        """The c4 indexer: the harness's scores (each visible block's key, read through the metadata's page
        table, against the row's indexer query; ties to the lower block, as the reference model's indexer),
        then SGLang's top-k transform into the metadata's sparse indices. `ranks`: a CP batch's plans by rank, each
        rank's indexer over its own query rows (`shard_hidden_states`) into its own plan."""
        real, indexer_k, metadata = self.real, self.harness_pool.indexer_k, segments.metadata
        width = max(fb.seq_lens_cpu) // 4 + 1
        blocks = torch.arange(width, device=fb.q_index.device)
        per_page = real_backend.PAGE_SIZE // 4

        def top_k_of(plan, q_index) -> None:
            index = plan.indexer_metadata
            pages = index.page_table[: q_index.shape[0]].long()
            page = pages[:, (blocks // per_page).clamp(max=pages.shape[1] - 1)]
            slots = (page * per_page + blocks % per_page).clamp(min=0) * 4
            scores = (indexer_k[slots] * q_index[:, None, :]).sum(-1)
            real.c4_top_k(plan, scores * _TIE_BREAK - blocks, segments.c4_device_indices)

        def top_k():
            with self.sglang():
                if ranks is None:
                    top_k_of(metadata, fb.q_index)
                    return
                for rank, plan in enumerate(ranks):
                    with cp_rank(self.api, rank):
                        top_k_of(plan, self._shard(fb.q_index, forward_batch))

        reads = {"indexer_k": None, **self._named("meta")}
        if real.hisparse:  # the indexer's HiSparse step translates the page indices (`RealDsv4.c4_top_k`)
            reads["full_to_hisparse"] = None
        self.device.launch(f"{segments.prefix}layer{layer}.indexer.top_k", top_k, reads=reads,
                           writes=self._named("meta.c4_sparse"))

    def _attention(self, fb, forward_batch, metadata, layer: int, ratio: int, out: torch.Tensor, *,
                   sparse: bool, builds: bool, graph: bool, ranks: Optional[tuple]) -> None:
        """The backend's `forward` for one layer, as one launch. `sparse`: the layer reads the chunk cache (noted for
        the `freshness` oracle, as a build the layer makes itself); `builds`: the chunk cache is missing at issue,
        so this layer is meant to build it from the tables (the coarse barrier orders that read; after a
        published event it is a race, which the tracker and the policy oracle report); `graph`: a breakable
        replay's eager segment, DSV4's attention op in the replay's contexts (`_graph_op`), which stores nothing
        (`save_kv_cache=False`: the captured `_swa_store` did); an eager forward stores the layer's latents first.
        `ranks`: a CP batch's plans by rank (`_cp_forward`)."""
        backend, radix = self.real.backend, self.real.layers[layer]
        q, k = fb.q[layer].to(torch.bfloat16), fb.kv_new[layer].to(torch.bfloat16)
        sink = self.mr.session.sink[layer]
        graph_op = self._graph_op() if graph else None

        def attend():
            with self.sglang(), self.bound(metadata):
                cache = metadata.sparse_prefill_cache
                if graph_op is not None:
                    graph_op(q, k, out[layer], layer, ratio, sink, False)
                elif ranks is not None:
                    out[layer].copy_(self._cp_forward(q, k, radix, forward_batch, ratio, sink, ranks))
                else:
                    out[layer].copy_(backend.forward(q, k, k, radix, forward_batch, compress_ratio=ratio,
                                                     attn_sink=sink))
                if metadata.sparse_prefill_cache is not cache:  # this layer built the chunk cache itself
                    self.probe.note(LazyBuild(layer=layer))
                    self.mr.plans.planned(PlanKind.CHUNK_CACHE, metadata.sparse_prefill_cache)
                if sparse:
                    self.mr.plans.read(PlanKind.CHUNK_CACHE, metadata.sparse_prefill_cache)

        reads = self._named(f"swa_kv[{layer}]", "meta", "cache")
        writes = self._named("out") if graph else self._named(f"swa_kv[{layer}]", "out")
        if ratio:
            reads.update(self._named(f"extra_kv[{layer}]"))
        if ratio == 4:
            reads.update(self._named("meta.c4_sparse"))
        if builds:
            reads.update({"req_to_token": self._rows_read(), **dict.fromkeys(_BUILD_READS)})
            writes.update(self._named("cache"))
        self.device.launch(f"{self.prefix}layer{layer}.DeepseekV4AttnBackend.forward", attend, reads=reads,
                           writes=writes)

    def _cp_forward(self, q, k, radix, forward_batch, ratio: int, sink, ranks: tuple) -> torch.Tensor:
        """A CP batch's layer as DSV4's attention runs it under CP-TP group sharing (`DeepseekV4Attention`, the CP
        branch of its prepare step): the whole chunk's SWA latents, gathered into token order, stored once through
        the backend (`store_cache`, at the plan's global write locations; every rank writes the same), then each
        rank's `forward` over its own query rows (`shard_hidden_states`) with its own plan and `save_kv_cache=False`,
        and the ranks' outputs gathered back into token order (`cp_interleave_to_sequence_order`), as the model's CP
        boundary does after attention. The all-gathers are the harness's: one process holds every rank's rows."""
        backend = self.real.backend
        backend.store_cache(radix.layer_id, k, forward_batch)
        shards = []
        for rank, plan in enumerate(ranks):
            with cp_rank(self.api, rank), self.bound(plan):
                shards.append(backend.forward(self._shard(q, forward_batch), k, k, radix, forward_batch,
                                              compress_ratio=ratio, save_kv_cache=False, attn_sink=sink))
        return self.api.mods["cp_interleave"].cp_interleave_to_sequence_order(torch.cat(shards), forward_batch)

    def _shard(self, rows: torch.Tensor, forward_batch) -> torch.Tensor:
        """This CP rank's rows of a batch-wide tensor, padded to the rank's physical length: SGLang's own shard."""
        return self.api.mods["cp_base"].get_cp_strategy().shard_hidden_states(rows, forward_batch)

    def _graph_op(self):
        """DSV4's attention op as the breakable graph's eager segment runs it, in the contexts the replay held when
        it issued the layer (the launched closure runs after the replay left them): the forward context, whose
        backend the op takes, and the prefill graph's context (`set_tc_piecewise_forward_context`: the static batch,
        the runner's attention layers). Outside a capture `bcg_deepseek_v4_attention_with_output` (`eager_on_graph`)
        calls the op itself, `deepseek_v4_attention_with_output`."""
        mods = self.api.mods
        contexts, graph_context = mods["forward_context"], mods["tc_context"]
        held_forward, held_graph = contexts.get_forward_context(), graph_context.get_tc_piecewise_forward_context()
        op = sglang_op(mods["model"].deepseek_v4_attention_with_output, self.api.kernels_on)

        def run(*args) -> None:
            with contexts.forward_context(held_forward), \
                    mock.patch.object(graph_context, "_tc_piecewise_forward_context", held_graph):
                op(*args)

        return run


@dataclasses.dataclass(frozen=True)
class _Segments:
    """What a layer's compressor store and indexer read: the batch's metadata and model inputs, or in a graph's
    replay the bucket's captured metadata and static inputs (`graph`), and with HiSparse the tensor its indexer's
    translation writes (`CapturedBucket.c4_device_indices`)."""

    metadata: Any
    compressed_new: torch.Tensor
    index_k_new: torch.Tensor
    graph: bool = False
    c4_device_indices: Optional[torch.Tensor] = None

    @property
    def prefix(self) -> str:
        return "prefill_graph." if self.graph else ""

    @property
    def reads(self) -> dict:
        return {"meta": None, **({"static_inputs": None} if self.graph else {})}


__all__ = ["EagerPath"]
