"""The attention backends: SGLang's base and DeepseekV4AttnBackend, both semantics.

Reads of the scheduler-shared tables (`req_to_token`, `full_to_swa_index_mapping`, HiSparse's
mapping, the per-batch tensors) are declared on every launch. A correct backend reads them only in
metadata init and the snapshot, i.e. before the shared-read-done event.
"""

from __future__ import annotations

import copy
from typing import Callable, Optional

import torch

from harness.model.attention import ceil_align, sparse_attention_on
from harness.model.enums import ForwardMode, SharedReadEnds
from harness.model.metadata import (LARGE_INDEXER_QUERY_THRESHOLD, DSV4AttnMetadata, DSV4Metadata,
                                    SparsePrefillChunkCache)
from harness.model.pools import ForwardBatch, staged
from harness.probe import Forward, LazyBuild, PlanKind, Planned, PlanRead, Snapshot, SwaLocFallback
from harness.semantics import Semantics

I32, I64 = torch.int32, torch.int64
PER_BATCH = ("fb.req_pool_indices", "fb.positions", "fb.seq_lens", "fb.extend_seq_lens", "fb.out_cache_loc")


class AttentionBackend:
    """Base backend: the snapshot hook is a no-op and never declares PRE_REPLAY."""

    def __init__(self, model_runner):
        self.model_runner = model_runner
        self.device = model_runner.device
        self.forward_metadata = None

    def shared_read_ends(self, forward_mode: ForwardMode) -> SharedReadEnds:
        if forward_mode.is_decode() or forward_mode.is_target_verify():
            return SharedReadEnds.IN_REPLAY
        return SharedReadEnds.UNKNOWN

    # PR-era hook: runners call it once the eager or replay query geometry is known.
    def prepare_prefill_shared_read_snapshot(self, forward_batch: ForwardBatch, *, num_qo_tokens: int) -> None:
        return None

    # 0.5.23 resolver: the gates, then the backend's snapshot.
    def resolve_prefill_shared_read_ends(self, forward_batch: ForwardBatch, *, num_qo_tokens: int,
                                         build_snapshot: bool = True) -> SharedReadEnds:
        flags = self.model_runner.flags
        if flags.SGLANG_FORCE_COARSE_WAR_BARRIER:
            return SharedReadEnds.UNKNOWN
        if not flags.prefill_read_done_enabled(self.model_runner.semantics):
            return SharedReadEnds.UNKNOWN
        if forward_batch.forward_mode is not ForwardMode.EXTEND:
            return SharedReadEnds.UNKNOWN
        if build_snapshot:
            return self._snapshot_prefill_shared_reads(forward_batch, num_qo_tokens=num_qo_tokens)
        return self.shared_read_ends(forward_batch.forward_mode)

    def _snapshot_prefill_shared_reads(self, forward_batch: ForwardBatch, *, num_qo_tokens: int) -> SharedReadEnds:
        return self.shared_read_ends(forward_batch.forward_mode)


class DeepseekV4AttnBackend(AttentionBackend):
    def __init__(self, model_runner):
        super().__init__(model_runner)
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.dims = model_runner.dims
        self.probe = model_runner.probe

    def cp_shards(self, forward_batch: ForwardBatch) -> bool:
        """Whether CP shards this batch (`Flags.cp_shards`: SGLang's `is_cp_active`, which counts the live tokens)."""
        return self.model_runner.flags.cp_shards(forward_batch.forward_mode, sum(forward_batch.extend_seq_lens_cpu))

    # -- declarations ------------------------------------------------------------------------

    def shared_read_ends(self, forward_mode: ForwardMode) -> SharedReadEnds:
        if forward_mode.is_target_verify():
            return SharedReadEnds.IN_REPLAY if self.model_runner.spec_algorithm.is_dspark() else SharedReadEnds.POST_REPLAY
        if (not self.model_runner.semantics.resolves_read_ends and forward_mode is ForwardMode.EXTEND
                and isinstance(self.forward_metadata, DSV4Metadata)
                and self.forward_metadata.prefill_shared_reads_snapshotted):
            return SharedReadEnds.PRE_REPLAY
        return super().shared_read_ends(forward_mode)

    def _use_sparse_prefill(self, forward_batch: ForwardBatch, *, num_qo_tokens: int) -> bool:
        """Shared by the snapshot and the forward dispatch, so no forward builds the cache after read-done."""
        flags = self.model_runner.flags
        return (
            forward_batch.forward_mode.is_extend_without_speculative()
            and not self.cp_shards(forward_batch)
            # the sglang target's layers ask this of the installed release's metadata: before 0.5.21 it has no tail
            and getattr(self.forward_metadata, "late_layer_tail", None) is None
            and (num_qo_tokens > LARGE_INDEXER_QUERY_THRESHOLD or flags.SGLANG_OPT_FLASHMLA_SPARSE_PREFILL)
        )

    # -- PR-era snapshot -----------------------------------------------------------------------

    def prepare_prefill_shared_read_snapshot(self, forward_batch: ForwardBatch, *, num_qo_tokens: int) -> None:
        if self.token_to_kv_pool.request_window is not None:
            return
        metadata = self.forward_metadata
        if isinstance(metadata, DSV4Metadata):
            metadata.prefill_shared_reads_snapshotted = False
        flags = self.model_runner.flags
        if not (flags.prefill_read_done_enabled(Semantics.PR)
                and forward_batch.forward_mode is ForwardMode.EXTEND
                and self.model_runner.spec_algorithm.is_dflash_family()
                and not self.cp_shards(forward_batch)
                and not flags.hisparse):  # backported from 0.5.23, like the offload gate
            return
        use_sparse = self._use_sparse_prefill(forward_batch, num_qo_tokens=num_qo_tokens)
        self.probe.note(Snapshot(num_qo_tokens=num_qo_tokens, sparse=use_sparse))
        if use_sparse:
            metadata.sparse_prefill_cache = self._build_sparse_prefill_chunk_cache(
                forward_batch, metadata.core_attn_metadata, num_qo_tokens=num_qo_tokens)
        metadata.prefill_shared_reads_snapshotted = True

    # -- 0.5.23 snapshot -------------------------------------------------------------------------

    def _snapshot_prefill_shared_reads(self, forward_batch: ForwardBatch, *, num_qo_tokens: int) -> SharedReadEnds:
        flags = self.model_runner.flags
        if self.cp_shards(forward_batch) or flags.hisparse:
            return SharedReadEnds.UNKNOWN
        metadata = self.forward_metadata
        use_sparse = self._use_sparse_prefill(forward_batch, num_qo_tokens=num_qo_tokens)
        self.probe.note(Snapshot(num_qo_tokens=num_qo_tokens, sparse=use_sparse))
        if use_sparse:
            metadata.sparse_prefill_cache = self._build_sparse_prefill_chunk_cache(
                forward_batch, metadata.core_attn_metadata, num_qo_tokens=num_qo_tokens)
        return SharedReadEnds.PRE_REPLAY

    # -- metadata init -----------------------------------------------------------------------------

    metadata_cls = DSV4Metadata

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        self.forward_metadata = self.metadata_cls(self.build_core_metadata(forward_batch))
        self.planned(PlanKind.METADATA, self.forward_metadata)

    def planned(self, kind: PlanKind, plan) -> None:
        """`plan` (metadata or a chunk cache) was just filled for the batch in flight: it gets a new plan number,
        which the probe notes, so the `freshness` oracle can tell this batch's plans from one kept from another."""
        plan.plan = next(self.model_runner.plan_numbers)
        self.probe.note(Planned(kind, plan.plan))

    def build_core_metadata(self, fb: ForwardBatch) -> DSV4AttnMetadata:
        dims, dev = self.dims, self.device
        r2t = self.req_to_token_pool.req_to_token
        f2s = self.token_to_kv_pool.full_to_swa_index_mapping
        tdev, rows, ps = r2t.device, fb.num_tokens, dims.page_size
        pages, c128_max = r2t.shape[1] // ps, max(r2t.shape[1] // 128, 1)
        row_req = staged(fb.row_req, I64, tdev)

        def empty(*shape, dtype=I32):
            return torch.empty(*shape, dtype=dtype, device=tdev)

        core = DSV4AttnMetadata(
            page_size=ps, index_topk=dims.index_topk,
            page_table=empty(rows, pages), raw_out_loc=fb.out_cache_loc,
            seq_lens_casual=empty(rows), positions_casual=empty(rows, dtype=I64),
            swa_page_indices=empty(rows, dims.swa_window), swa_topk_lengths=empty(rows),
            swa_out_cache_loc=empty(rows, dtype=I64),
            c4_out_loc=empty(rows, dtype=I64), c128_out_loc=empty(rows, dtype=I64),
            c4_topk_lengths_raw=empty(rows), c4_topk_lengths_clamp1=empty(rows), c4_sparse_topk_lengths=empty(rows),
            c4_sparse_page_indices=torch.full((rows, dims.index_topk), -1, dtype=I32, device=tdev),
            c4_sparse_raw_indices=torch.full((rows, dims.index_topk), -1, dtype=I32, device=tdev),
            c128_page_indices=empty(rows, c128_max), c128_topk_lengths_clamp1=empty(rows),
            row_req=list(fb.row_req),
        )
        batch_rows = frozenset(fb.req_pool_indices_cpu)
        c = copy.copy(core)  # closures bind tensors at issue time, as a kernel launch binds pointers

        def page_table_step():
            rpi = fb.req_pool_indices.long()[row_req]
            starts = torch.arange(pages, device=tdev) * ps
            c.page_table.copy_(r2t[rpi[:, None], starts[None, :]] // ps)
            c.seq_lens_casual.copy_(fb.positions + 1)
            c.positions_casual.copy_(fb.positions)

        def swa_step():
            rpi = fb.req_pool_indices.long()[row_req]
            indices, lengths = swa_window_indices(r2t, f2s, rpi, fb.positions, dims.swa_window)
            c.swa_page_indices.copy_(indices)
            c.swa_topk_lengths.copy_(lengths)
            c.swa_out_cache_loc.copy_(f2s[fb.out_cache_loc])

        def compress_step():
            pos = c.positions_casual
            for ratio, out in ((4, c.c4_out_loc), (128, c.c128_out_loc)):
                start = ((pos + 1) // ratio - 1).clamp(min=0) * ratio
                out.copy_(torch.where((pos + 1) % ratio == 0, page_slot(c.page_table, start, ps), -1))
            raw = (pos + 1) // 4
            c.c4_topk_lengths_raw.copy_(raw)
            c.c4_topk_lengths_clamp1.copy_(raw.clamp(min=1))
            c.c4_sparse_topk_lengths.copy_(raw.clamp(max=dims.index_topk))
            blocks = torch.arange(c128_max, device=tdev)
            visible = (pos + 1) // 128
            slots = page_slot(c.page_table, (blocks * 128)[None, :].expand(rows, -1), ps)
            c.c128_page_indices.copy_(torch.where(blocks[None, :] < visible[:, None], slots, -1))
            c.c128_topk_lengths_clamp1.copy_(visible.clamp(min=1))

        meta_core = {"meta.page_table": None, "meta.seq_lens_casual": None, "meta.positions_casual": None}
        dev.launch("init_forward_metadata.page_table", page_table_step,
                   reads={"req_to_token": batch_rows, "fb.req_pool_indices": None, "fb.positions": None},
                   writes=meta_core)
        dev.launch("init_forward_metadata.swa", swa_step,
                   reads={"req_to_token": batch_rows, "full_to_swa": None, "fb.req_pool_indices": None,
                          "fb.positions": None, "fb.out_cache_loc": None},
                   writes={"meta.swa_page_indices": None, "meta.swa_out_cache_loc": None})
        dev.launch("init_forward_metadata.compress", compress_step,
                   reads={"meta.page_table": None, "meta.positions_casual": None},
                   writes={"meta.c4_out_loc": None, "meta.c128_out_loc": None, "meta.c128_page_indices": None})
        return core

    # -- the sparse prefill chunk cache -----------------------------------------------------------

    def _build_sparse_prefill_chunk_cache(self, forward_batch: ForwardBatch, core: DSV4AttnMetadata, *,
                                          num_qo_tokens: int, label: str = "sparse_prefill_cache.build"
                                          ) -> SparsePrefillChunkCache:
        fb, dims, dev = forward_batch, self.dims, self.device
        r2t = self.req_to_token_pool.req_to_token
        f2s = self.token_to_kv_pool.full_to_swa_index_mapping
        tdev, window = r2t.device, dims.swa_window
        seq, ext = fb.seq_lens_cpu, fb.extend_seq_lens_cpu
        real = sum(ext)
        if num_qo_tokens < real:
            raise AssertionError(f"num_qo_tokens={num_qo_tokens} < sum(extend_seq_lens)={real}")
        gather = [min(s, e + window - 1) for s, e in zip(seq, ext)]
        first = [s - g for s, g in zip(seq, gather)]
        offsets = _cumsum(gather)
        entry_req = staged([r for r, g in enumerate(gather) for _ in range(g)], I64, tdev)
        entry_pos = staged([p for f, s in zip(first, seq) for p in range(f, s)], I64, tdev)
        row_req = list(core.row_req[:real])
        base = staged([offsets[r] - first[r] for r in row_req], I64, tdev)
        width = ceil_align(window, dims.index_align)
        cache = SparsePrefillChunkCache(
            num_qo_tokens=num_qo_tokens, num_real_rows=real,
            swa_token_ids=torch.empty(offsets[-1], dtype=I32, device=tdev),
            swa_offsets=offsets, swa_first_pos=first, swa_gather_lens=gather, query_start_loc=_cumsum(ext),
            query_pos=torch.zeros(num_qo_tokens, dtype=I64, device=tdev),
            c0_combined_indices=torch.full((num_qo_tokens, width), -1, dtype=I32, device=tdev),
            c0_combined_lens=torch.zeros(num_qo_tokens, dtype=I32, device=tdev),
            seq_lens_cpu=list(seq), row_req=row_req,
        )

        seq_lens_casual = core.seq_lens_casual

        def build():
            rpi = fb.req_pool_indices.long()
            cache.swa_token_ids.copy_(f2s[r2t[rpi[entry_req], entry_pos].long()])
            n = min(num_qo_tokens, seq_lens_casual.shape[0])
            cache.query_pos[:n].copy_(seq_lens_casual[:n].long() - 1)
            pos = cache.query_pos[:real]
            swa_len = (pos + 1).clamp(max=window)
            j = torch.arange(width, device=tdev)
            idx = (base + pos - swa_len + 1)[:, None] + j[None, :]
            cache.c0_combined_indices[:real].copy_(torch.where(j[None, :] < swa_len[:, None], idx, -1))
            cache.c0_combined_lens[:real].copy_(swa_len)

        dev.launch(label, build,
                   reads={"req_to_token": frozenset(fb.req_pool_indices_cpu), "full_to_swa": None,
                          "fb.req_pool_indices": None, "meta.seq_lens_casual": None},
                   writes={"cache.swa_token_ids": None, "cache.c0_combined_indices": None})
        self.planned(PlanKind.CHUNK_CACHE, cache)
        return cache

    # -- the model's forward after metadata init ------------------------------------------------------

    def forward_layers(self, fb: ForwardBatch, out: torch.Tensor,
                       store_compressed: Optional[Callable[[int], None]] = None) -> None:
        """Per layer: store KV, run the indexer (ratio 4), attend. `store_compressed` replays a graph."""
        dims = self.dims
        mode = fb.forward_mode
        if self.cp_shards(fb):
            self.late_refresh_swa_rows("cp.shard_metadata", fb, range(fb.num_tokens))
        if mode is ForwardMode.MIXED:
            decode_rows = [t for t, r in enumerate(fb.row_req[:sum(fb.extend_seq_lens_cpu)])
                           if fb.extend_seq_lens_cpu[r] == 1]
            self.late_refresh_swa_rows("mixed.decode_rows", fb, decode_rows)
        rows = fb.num_tokens
        sparse = self._use_sparse_prefill(fb, num_qo_tokens=rows)
        self.probe.note(Forward(rows=rows, sparse=sparse))
        self.probe.note(PlanRead(PlanKind.METADATA, self.forward_metadata.plan))
        for layer, ratio in enumerate(dims.layer_ratios):
            self._store_swa(fb, layer)
            if store_compressed is not None:
                store_compressed(layer)
            else:
                self.store_compressed(fb, layer, self.forward_metadata.core_attn_metadata)
            if ratio == 4:
                self.run_indexer(fb, layer)
            if sparse:
                self._attend_sparse(fb, layer, out)
            else:
                self.attend_dense(fb, layer, out)

    def late_refresh_swa_rows(self, label: str, fb: ForwardBatch, rows) -> None:
        """Steps that translate through the live tables inside the forward (CP sharding, MIXED decode rows)."""
        rows = list(rows)
        if not rows:
            return
        core = copy.copy(self.forward_metadata.core_attn_metadata)
        r2t = self.req_to_token_pool.req_to_token
        f2s = self.token_to_kv_pool.full_to_swa_index_mapping
        sel = staged(rows, I64, r2t.device)
        row_req = staged([fb.row_req[t] for t in rows], I64, r2t.device)

        def step():
            rpi = fb.req_pool_indices.long()[row_req]
            indices, _ = swa_window_indices(r2t, f2s, rpi, core.positions_casual[sel], self.dims.swa_window)
            core.swa_page_indices[sel] = indices.to(core.swa_page_indices.dtype)

        rows_read = frozenset(fb.req_pool_indices_cpu[fb.row_req[t]] for t in rows)
        self.device.launch(label, step, reads={"req_to_token": rows_read, "full_to_swa": None,
                                               "fb.req_pool_indices": None, "meta.positions_casual": None},
                           writes={"meta.swa_page_indices": None})

    def _store_swa(self, fb: ForwardBatch, layer: int) -> None:
        loc = self.get_swa_out_cache_loc(fb)
        swa_kv = self.token_to_kv_pool.swa_kv

        def store():
            swa_kv[layer].index_copy_(0, loc, fb.kv_new[layer])

        self.device.launch(f"layer{layer}.store_swa", store, reads={"meta.swa_out_cache_loc": None},
                           writes={f"swa_kv[{layer}]": None})

    def get_swa_out_cache_loc(self, fb: ForwardBatch) -> torch.Tensor:
        """The snapshot, unless it is missing or its length differs: then the live mapping (a late read)."""
        core = self.forward_metadata.core_attn_metadata
        loc = core.swa_out_cache_loc
        if loc is not None and loc.shape[0] == fb.out_cache_loc.shape[0]:
            return loc
        f2s = self.token_to_kv_pool.full_to_swa_index_mapping
        self.probe.note(SwaLocFallback())
        fresh = torch.empty_like(fb.out_cache_loc)
        self.device.launch("get_swa_out_cache_loc.retranslate", lambda: fresh.copy_(f2s[fb.out_cache_loc]),
                           reads={"full_to_swa": None, "fb.out_cache_loc": None}, writes={"tmp.swa_loc": None})
        return fresh

    def store_compressed(self, fb: ForwardBatch, layer: int, core: DSV4AttnMetadata) -> None:
        """Captured in graph mode: the closure keeps the out_loc tensors it was issued with."""
        ratio = self.dims.layer_ratios[layer]
        if not ratio:
            return
        pool = self.token_to_kv_pool
        out_loc = core.c4_out_loc if ratio == 4 else core.c128_out_loc

        def store():
            loc = out_loc.clamp(min=0)  # rows that complete no block write zeros into the dummy slot 0
            pool.extra_kv[layer].index_copy_(0, loc, fb.compressed_new[layer])
            if ratio == 4:
                pool.indexer_k.index_copy_(0, loc, fb.index_k_new)

        self.device.launch(f"layer{layer}.store_compressed", store,
                           reads={f"meta.c{ratio}_out_loc": None},
                           writes={f"extra_kv[{layer}]": None, "indexer_k": None})

    def run_indexer(self, fb: ForwardBatch, layer: int) -> None:
        """Layer `layer`'s indexer: each query row's top-k compressed blocks into the layer's index rows
        (public: the sglang target runs it inside the real runner's forward)."""
        core = copy.copy(self.forward_metadata.core_attn_metadata)
        pool, dims = self.token_to_kv_pool, self.dims
        topk, ps = dims.index_topk, dims.page_size
        nmax = max([s // 4 for s in fb.seq_lens_cpu] + [1])
        width = max(nmax, topk)
        tdev = core.positions_casual.device

        def select():
            pos = core.positions_casual
            visible = (pos + 1) // 4
            blocks = torch.arange(width, device=tdev)
            valid = blocks[None, :] < visible[:, None]
            starts = (blocks.clamp(max=nmax - 1) * 4)[None, :].expand(pos.shape[0], -1)
            slots = page_slot(core.page_table, starts, ps)
            scores = (pool.indexer_k[slots] * fb.q_index[:, None, :]).sum(-1)
            scores = scores.masked_fill(~valid, float("-inf"))
            order = torch.sort(-scores, dim=1, stable=True).indices[:, :topk]
            keep = torch.arange(topk, device=tdev)[None, :] < visible.clamp(max=topk)[:, None]
            raw = torch.sort(torch.where(keep, order, width), dim=1).values
            raw = torch.where(raw < width, raw, -1)
            core.c4_sparse_raw_indices.copy_(raw)
            core.c4_sparse_page_indices.copy_(torch.where(raw >= 0, slots.gather(1, raw.clamp(min=0)), -1))

        self.device.launch(f"layer{layer}.indexer", select,
                           reads={"indexer_k": None, "meta.page_table": None, "meta.positions_casual": None},
                           writes={"meta.c4_sparse_raw_indices": None, "meta.c4_sparse_page_indices": None})

    def compressed_slots(self, slots: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """HiSparse translates every compressed slot through its live mapping, in every layer."""
        if not self.model_runner.flags.hisparse:
            return slots, {}
        f2h = self.token_to_kv_pool.full_to_hisparse
        return torch.where(slots >= 0, f2h[slots.clamp(min=0)], -1), {"full_to_hisparse": None}

    def attend_dense(self, fb: ForwardBatch, layer: int, out: torch.Tensor) -> None:
        """Layer `layer`'s attention over the metadata's page indices (SWA, and the layer's compressed
        ones), without the sparse prefill chunk cache, into `out` (public: the sglang target runs it
        inside the real runner's forward)."""
        core = self.forward_metadata.core_attn_metadata
        pool, dims = self.token_to_kv_pool, self.dims
        ratio, sink = dims.layer_ratios[layer], self.model_runner.sink[layer]
        swa_idx = core.swa_page_indices
        comp = {4: core.c4_sparse_page_indices, 128: core.c128_page_indices}.get(ratio)
        reads = {f"swa_kv[{layer}]": None, f"extra_kv[{layer}]": None, "meta.swa_page_indices": None}
        if comp is not None:
            reads["meta.c4_sparse_page_indices" if ratio == 4 else "meta.c128_page_indices"] = None
        if self.model_runner.flags.hisparse and comp is not None:
            reads["full_to_hisparse"] = None

        def attend():
            kv = torch.cat([pool.extra_kv[layer], pool.swa_kv[layer]])
            swa = torch.where(swa_idx >= 0, swa_idx.long() + pool.size, -1)
            if comp is None:
                idx = swa
            else:
                idx = torch.cat([self.compressed_slots(comp.long())[0], swa], dim=1)
            out[layer].copy_(sparse_attention_on(kv.device)(fb.q[layer], kv, idx, sink, dims.head_dim ** -0.5))

        self.device.launch(f"layer{layer}.attention.dense", attend, reads=reads, writes={"out": None})

    def _attend_sparse(self, fb: ForwardBatch, layer: int, out: torch.Tensor) -> None:
        metadata = self.forward_metadata
        core, pool, dims = copy.copy(metadata.core_attn_metadata), self.token_to_kv_pool, self.dims
        if metadata.sparse_prefill_cache is None:
            metadata.sparse_prefill_cache = self._build_sparse_prefill_chunk_cache(
                fb, core, num_qo_tokens=fb.num_tokens, label=f"layer{layer}.sparse_prefill_cache.lazy_build")
            self.probe.note(LazyBuild(layer=layer))
        cache = metadata.sparse_prefill_cache
        self.probe.note(PlanRead(PlanKind.CHUNK_CACHE, cache.plan))
        if cache.num_qo_tokens != fb.num_tokens:
            raise RuntimeError(f"sparse prefill cache built for {cache.num_qo_tokens} query rows, "
                               f"the forward has {fb.num_tokens}")
        ratio, sink = dims.layer_ratios[layer], self.model_runner.sink[layer]
        ps, tdev = dims.page_size, core.page_table.device
        seq = cache.seq_lens_cpu
        width = (dims.index_topk if ratio == 4 else core.c128_page_indices.shape[1]) if ratio else 0
        if ratio:
            blocks = [s // ratio for s in seq]
            comp_base = staged(_cumsum(blocks)[:-1], I64, tdev)
            first_row = staged([cache.query_start_loc[r] if r < len(cache.query_start_loc) - 1 else 0
                                      for r in range(len(seq))], I64, tdev)
            entry_req = staged([r for r, b in enumerate(blocks) for _ in range(b)], I64, tdev)
            entry_pos = staged([i * ratio for b in blocks for i in range(b)], I64, tdev)
            row_req = staged(cache.row_req + [cache.row_req[-1] if cache.row_req else 0]
                                   * (cache.num_qo_tokens - cache.num_real_rows), I64, tdev)
        reads = {f"swa_kv[{layer}]": None, "cache.swa_token_ids": None, "cache.c0_combined_indices": None}
        if ratio:
            reads.update({f"extra_kv[{layer}]": None, "meta.page_table": None, "meta.positions_casual": None})
            if ratio == 4:
                reads["meta.c4_sparse_raw_indices"] = None
            if self.model_runner.flags.hisparse:
                reads["full_to_hisparse"] = None

        def attend():
            swa_region = pool.swa_kv[layer][cache.swa_token_ids.long()]
            c0 = cache.c0_combined_indices.long()
            if not ratio:
                kv, idx = swa_region, c0
            else:
                slots = page_slot(core.page_table[first_row[entry_req]], entry_pos[:, None], ps)[:, 0]
                slots = self.compressed_slots(slots)[0]
                comp_region = pool.extra_kv[layer][slots.clamp(min=0)]
                if ratio == 4:
                    raw = core.c4_sparse_raw_indices.long()
                else:
                    visible = (core.positions_casual + 1) // 128
                    cols = torch.arange(width, device=tdev)[None, :]
                    raw = torch.where(cols < visible[:, None], cols, -1)
                raw = raw[: cache.num_qo_tokens]
                comp_part = torch.where(raw >= 0, comp_base[row_req][:, None] + raw, -1)
                if cache.num_real_rows < cache.num_qo_tokens:
                    comp_part[cache.num_real_rows:] = -1
                swa_part = torch.where(c0 >= 0, c0 + comp_region.shape[0], -1)
                kv, idx = torch.cat([comp_region, swa_region]), torch.cat([comp_part, swa_part], dim=1)
            out[layer].copy_(sparse_attention_on(kv.device)(fb.q[layer], kv, idx, sink, dims.head_dim ** -0.5))

        self.device.launch(f"layer{layer}.attention.sparse", attend, reads=reads, writes={"out": None})


def swa_window_indices(r2t, f2s, rpi, positions, window):
    """SWA slots of each row's window through req_to_token and full_to_swa; -1 past the window's length."""
    j = torch.arange(window, device=r2t.device)
    lengths = (positions + 1).clamp(max=window)
    pos = positions[:, None] - lengths[:, None] + 1 + j[None, :]
    full = r2t[rpi[:, None], pos.clamp(min=0, max=r2t.shape[1] - 1)].long()
    return torch.where(j[None, :] < lengths[:, None], f2s[full], -1), lengths


def page_slot(page_table: torch.Tensor, positions: torch.Tensor, page_size: int) -> torch.Tensor:
    """Full slot of a position through the private page table: page * page_size + offset."""
    rows = torch.arange(page_table.shape[0], device=page_table.device)[:, None]
    pos = positions if positions.dim() == 2 else positions[:, None]
    slot = page_table[rows, pos // page_size].long() * page_size + pos % page_size
    return slot if positions.dim() == 2 else slot[:, 0]


def _cumsum(values) -> list[int]:
    out = [0]
    for v in values:
        out.append(out[-1] + v)
    return out
