"""The seeded-bug corpus: the reference with exactly one real bug put back.

Each mutant is one small definition: a name, a one-line description, where the bug comes from,
the oracle expected to catch it, and the one part of the reference it replaces.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch

from harness.model import runners
from harness.model.backend import AttentionBackend, DeepseekV4AttnBackend, swa_window_indices
from harness.model.enums import ForwardMode, SharedReadEnds
from harness.model.metadata import (COPY_IN_PLACE, LARGE_INDEXER_QUERY_THRESHOLD, DSV4AttnMetadata, DSV4Metadata,
                                    launch_now)
from harness.model.pools import staged
from harness.model.runners import ModelRunner, PrefillGraphRunner
from harness.model.scheduler import Scheduler
from harness.probe import PlanKind, PlanRead, Snapshot
from harness.semantics import Semantics
from harness.targets import Classes, ReferenceTarget
from harness.validation import check_one_of


@dataclass(frozen=True)
class Mutant:
    name: str
    description: str
    source: str
    expected_oracle: str
    build: Callable[[], Classes]


MUTANTS: dict[str, Mutant] = {}


def mutant(name: str, description: str, source: str, expected_oracle: str):
    def register(build: Callable[[], Classes]) -> Callable[[], Classes]:
        MUTANTS[name] = Mutant(name, description, source, expected_oracle, build)
        return build
    return register


def mutant_target(name: str) -> ReferenceTarget:
    check_one_of(name, MUTANTS, "mutant")
    return ReferenceTarget(MUTANTS[name].build(), name=f"reference+{name}")


def _runner(**attrs) -> Classes:
    return Classes(model_runner=type("MutantModelRunner", (ModelRunner,), attrs))


def _backend(**methods) -> Classes:
    return _runner(backend_cls=type("MutantBackend", (DeepseekV4AttnBackend,), methods))


# -- the corpus -------------------------------------------------------------------------------------------

@mutant("snapshot_skipped", "the snapshot is skipped (cache built lazily in the first layer) while PRE_REPLAY is "
        "still declared", "#35947 motivation", "differential")
def _snapshot_skipped() -> Classes:
    def _snapshot_prefill_shared_reads(self, forward_batch, *, num_qo_tokens):
        if self.cp_shards(forward_batch) or self.model_runner.flags.hisparse:
            return SharedReadEnds.UNKNOWN
        self.probe.note(Snapshot(num_qo_tokens=num_qo_tokens,
                                 sparse=self._use_sparse_prefill(forward_batch, num_qo_tokens=num_qo_tokens)))
        return SharedReadEnds.PRE_REPLAY

    def prepare_prefill_shared_read_snapshot(self, forward_batch, *, num_qo_tokens):
        DeepseekV4AttnBackend.prepare_prefill_shared_read_snapshot(self, forward_batch, num_qo_tokens=num_qo_tokens)
        if self.forward_metadata.prefill_shared_reads_snapshotted:
            self.forward_metadata.sparse_prefill_cache = None  # the build is skipped, the flag stays

    return _backend(_snapshot_prefill_shared_reads=_snapshot_prefill_shared_reads,
                    prepare_prefill_shared_read_snapshot=prepare_prefill_shared_read_snapshot)


@mutant("event_before_snapshot", "the event is recorded before the sparse chunk cache is built",
        "#35947 ordering", "differential")
def _event_before_snapshot() -> Classes:
    def _build_sparse_prefill_chunk_cache(self, forward_batch, core, *, num_qo_tokens, label="sparse_prefill_cache.build"):
        if label == "sparse_prefill_cache.build":
            runners.record_and_publish(self.model_runner, self.device)
            self.model_runner.early_event = True
        return DeepseekV4AttnBackend._build_sparse_prefill_chunk_cache(
            self, forward_batch, core, num_qo_tokens=num_qo_tokens, label=label)

    def publish(model_runner, ends, device):
        if not getattr(model_runner, "early_event", False):
            runners.maybe_publish_prefill_shared_read_done(model_runner, ends, device)
        model_runner.early_event = False

    def publish_pr(model_runner, fb, device):
        if not getattr(model_runner, "early_event", False):
            runners.maybe_publish_prefill_shared_read_done_pr(model_runner, fb, device)
        model_runner.early_event = False

    backend = type("MutantBackend", (DeepseekV4AttnBackend,),
                   {"_build_sparse_prefill_chunk_cache": _build_sparse_prefill_chunk_cache})
    return _runner(backend_cls=backend, publish=staticmethod(publish), publish_pr=staticmethod(publish_pr))


@mutant("eagle_publishes", "the publish gate lets EAGLE / MTP publish although their draft extend re-reads the tables",
        "#35947 TODO (Jialin)", "differential")
def _eagle_publishes() -> Classes:
    def publish(model_runner, ends, device):
        if ends is SharedReadEnds.PRE_REPLAY and not model_runner.flags.offloads_kv():
            runners.record_and_publish(model_runner, device)

    def publish_pr(model_runner, fb, device):
        if (model_runner.flags.prefill_read_done_enabled(Semantics.PR) and fb.forward_mode is ForwardMode.EXTEND
                and model_runner.attn_backend.shared_read_ends(fb.forward_mode) is SharedReadEnds.PRE_REPLAY):
            runners.record_and_publish(model_runner, device)

    def prepare_prefill_shared_read_snapshot(self, forward_batch, *, num_qo_tokens):
        spec = self.model_runner.spec_algorithm
        if spec.is_eagle_family():  # the PR-era snapshot gate is widened the same way
            self.model_runner.spec_algorithm = type(spec).DFLASH
            try:
                return DeepseekV4AttnBackend.prepare_prefill_shared_read_snapshot(
                    self, forward_batch, num_qo_tokens=num_qo_tokens)
            finally:
                self.model_runner.spec_algorithm = spec
        return DeepseekV4AttnBackend.prepare_prefill_shared_read_snapshot(self, forward_batch, num_qo_tokens=num_qo_tokens)

    backend = type("MutantBackend", (DeepseekV4AttnBackend,),
                   {"prepare_prefill_shared_read_snapshot": prepare_prefill_shared_read_snapshot})
    return _runner(backend_cls=backend, publish=staticmethod(publish), publish_pr=staticmethod(publish_pr))


@mutant("snapshot_is_view", "the snapshot is a view of req_to_token / Full-to-SWA: the gather happens when a layer "
        "reads it", "#35947 review", "differential")
def _snapshot_is_view() -> Classes:
    def _attend_sparse(self, fb, layer, out):
        cache = self.forward_metadata.sparse_prefill_cache
        if cache is not None:
            r2t = self.req_to_token_pool.req_to_token
            f2s = self.token_to_kv_pool.full_to_swa_index_mapping
            rows = staged([r for r, g in enumerate(cache.swa_gather_lens) for _ in range(g)], torch.int64,
                          r2t.device)
            pos = staged([p for f, s in zip(cache.swa_first_pos, cache.seq_lens_cpu) for p in range(f, s)],
                         torch.int64, r2t.device)

            def view_read():
                cache.swa_token_ids.copy_(f2s[r2t[fb.req_pool_indices.long()[rows], pos].long()])

            self.device.launch(f"layer{layer}.sparse_prefill_cache.view_read", view_read,
                               reads={"req_to_token": frozenset(fb.req_pool_indices_cpu), "full_to_swa": None,
                                      "fb.req_pool_indices": None},
                               writes={"cache.swa_token_ids": None})
        DeepseekV4AttnBackend._attend_sparse(self, fb, layer, out)

    return _backend(_attend_sparse=_attend_sparse)


@mutant("pr_flag_before_build", "PR-era: prefill_shared_reads_snapshotted is set before the build, so a failing "
        "build leaves it set", "#35947 test_sparse_prefill_snapshot_marks_success_only_after_build", "contract")
def _pr_flag_before_build() -> Classes:
    """The reference's snapshot, with the flag left set when the build raises: what setting it before the
    build does, and all it changes (a build that succeeds sets it anyway). The build itself cannot be the
    override: the contract probe replaces `_build_sparse_prefill_chunk_cache` on the instance."""
    def prepare_prefill_shared_read_snapshot(self, forward_batch, *, num_qo_tokens):
        try:
            DeepseekV4AttnBackend.prepare_prefill_shared_read_snapshot(self, forward_batch, num_qo_tokens=num_qo_tokens)
        except Exception:
            self.forward_metadata.prefill_shared_reads_snapshotted = True  # the bug: marked before the build
            raise

    return _backend(prepare_prefill_shared_read_snapshot=prepare_prefill_shared_read_snapshot)


@mutant("copy_keeps_cache", "copy_ does not reset sparse_prefill_cache (nor, PR-era, the snapshotted flag)",
        "#35947 copy_", "policy")
def _copy_keeps_cache() -> Classes:
    class Metadata(DSV4Metadata):
        def copy_(self, other, launch=launch_now):
            self.core_attn_metadata.copy_(other.core_attn_metadata, launch)

    return _backend(metadata_cls=Metadata)


@mutant("refresh_keeps_cache", "refresh_for_breakable_cuda_graph_replay_ does not reset the cache or the flag",
        "#35947 refresh", "policy")
def _refresh_keeps_cache() -> Classes:
    class Metadata(DSV4Metadata):
        def refresh_for_breakable_cuda_graph_replay_(self, other, launch=launch_now):
            self.core_attn_metadata.refresh_for_breakable_cuda_graph_replay_(other.core_attn_metadata, launch)

    return _backend(metadata_cls=Metadata)


@mutant("graph_snapshot_real_count", "graph replay snapshots with the real token count, not the padded bucket size",
        "#35947 test_replay_snapshot_uses_padded_token_count", "policy")
def _graph_snapshot_real_count() -> Classes:
    class Runner(PrefillGraphRunner):
        def execute(self, fb):
            self.real_tokens = fb.num_tokens
            return PrefillGraphRunner.execute(self, fb)

    def resolve_prefill_shared_read_ends(self, fb, *, num_qo_tokens, build_snapshot=True):
        real = getattr(self.model_runner.graph_runner, "real_tokens", None)
        return AttentionBackend.resolve_prefill_shared_read_ends(
            self, fb, num_qo_tokens=real or num_qo_tokens, build_snapshot=build_snapshot)

    def prepare_prefill_shared_read_snapshot(self, fb, *, num_qo_tokens):
        real = getattr(self.model_runner.graph_runner, "real_tokens", None)
        return DeepseekV4AttnBackend.prepare_prefill_shared_read_snapshot(self, fb, num_qo_tokens=real or num_qo_tokens)

    backend = type("MutantBackend", (DeepseekV4AttnBackend,), {
        "resolve_prefill_shared_read_ends": resolve_prefill_shared_read_ends,
        "prepare_prefill_shared_read_snapshot": prepare_prefill_shared_read_snapshot})
    return _runner(backend_cls=backend, graph_runner_cls=Runner)


@mutant("cp_snapshot_global", "CP active, and the snapshot is still built from the global pre-shard token count",
        "#35947 CP-v2 exclusion", "happens-before")
def _cp_snapshot_global() -> Classes:
    def _snapshot_prefill_shared_reads(self, forward_batch, *, num_qo_tokens):
        flags = self.model_runner.flags
        if not flags.cp_active:
            return DeepseekV4AttnBackend._snapshot_prefill_shared_reads(self, forward_batch, num_qo_tokens=num_qo_tokens)
        self.model_runner.flags = replace(flags, cp_active=False)
        try:
            return DeepseekV4AttnBackend._snapshot_prefill_shared_reads(self, forward_batch, num_qo_tokens=num_qo_tokens)
        finally:
            self.model_runner.flags = flags

    def prepare_prefill_shared_read_snapshot(self, forward_batch, *, num_qo_tokens):
        flags = self.model_runner.flags
        self.model_runner.flags = replace(flags, cp_active=False)
        try:
            DeepseekV4AttnBackend.prepare_prefill_shared_read_snapshot(self, forward_batch, num_qo_tokens=num_qo_tokens)
        finally:
            self.model_runner.flags = flags

    return _backend(_snapshot_prefill_shared_reads=_snapshot_prefill_shared_reads,
                    prepare_prefill_shared_read_snapshot=prepare_prefill_shared_read_snapshot)


@mutant("missing_token_to_kv_pool", "the backend is built without token_to_kv_pool (the CI break after #35947)",
        "#36639", "execution")
def _missing_token_to_kv_pool() -> Classes:
    def __init__(self, model_runner):
        DeepseekV4AttnBackend.__init__(self, model_runner)
        del self.token_to_kv_pool

    return _backend(__init__=__init__)


@mutant("base_hook_declares_pre_replay", "the base backend's hook declares PRE_REPLAY without snapshotting",
        "#35947 base_attn_backend docstring", "differential")
def _base_hook_declares_pre_replay() -> Classes:
    def _snapshot_prefill_shared_reads(self, forward_batch, *, num_qo_tokens):
        return SharedReadEnds.PRE_REPLAY  # the base hook's answer, DSV4's override bypassed

    def shared_read_ends(self, forward_mode):
        if forward_mode is ForwardMode.EXTEND and not self.model_runner.semantics.resolves_read_ends:
            return SharedReadEnds.PRE_REPLAY
        return DeepseekV4AttnBackend.shared_read_ends(self, forward_mode)

    return _backend(_snapshot_prefill_shared_reads=_snapshot_prefill_shared_reads, shared_read_ends=shared_read_ends)


@mutant("threshold_off_by_one", "the forward decides sparse at >= the threshold, the snapshot at >",
        "#35947 test_snapshot_builds_cache_only_for_sparse_prefill", "policy")
def _threshold_off_by_one() -> Classes:
    def forward_layers(self, fb, out, store_compressed=None):
        self._in_forward = True
        try:
            DeepseekV4AttnBackend.forward_layers(self, fb, out, store_compressed)
        finally:
            self._in_forward = False

    def _use_sparse_prefill(self, forward_batch, *, num_qo_tokens):
        bump = 1 if getattr(self, "_in_forward", False) and num_qo_tokens == LARGE_INDEXER_QUERY_THRESHOLD else 0
        return DeepseekV4AttnBackend._use_sparse_prefill(self, forward_batch, num_qo_tokens=num_qo_tokens + bump)

    return _backend(forward_layers=forward_layers, _use_sparse_prefill=_use_sparse_prefill)


@mutant("swa_loc_length_mismatch", "swa_out_cache_loc is one row short, so the forward re-translates through the "
        "live mapping after the event", "#32460 / #33587", "policy")
def _swa_loc_length_mismatch() -> Classes:
    def build_core_metadata(self, fb):
        core = DeepseekV4AttnBackend.build_core_metadata(self, fb)
        core.swa_out_cache_loc = core.swa_out_cache_loc[:-1]
        return core

    return _backend(build_core_metadata=build_core_metadata)


@mutant("copy_reassigns_captured", "copy_ reassigns c4/c128_out_loc, which captured graph kernels read by address",
        "#39116 (same class)", "kv")
def _copy_reassigns_captured() -> Classes:
    moved = ("c4_out_loc", "c128_out_loc")

    class Core(DSV4AttnMetadata):
        def copy_(self, other, launch=launch_now):
            self._move(other, tuple(n for n in COPY_IN_PLACE if n not in moved), ("swa_out_cache_loc", *moved), launch)

    def build_core_metadata(self, fb):
        core = DeepseekV4AttnBackend.build_core_metadata(self, fb)
        core.__class__ = Core
        return core

    return _backend(build_core_metadata=build_core_metadata)


@mutant("in_graph_live_metadata", "a captured in-graph metadata step re-reads live req_to_token / Full-to-SWA during "
        "replay, after a pre-replay event", "#31686 (trtllm_mha)", "happens-before")
def _in_graph_live_metadata() -> Classes:
    class Runner(PrefillGraphRunner):
        def _capture(self, bucket, padded):
            r2t = self.model_runner.req_to_token_pool.req_to_token
            self.row_pool_idx[bucket] = torch.zeros(bucket, dtype=torch.int64, device=r2t.device)
            self.static_positions[bucket] = padded.positions.clone()
            PrefillGraphRunner._capture(self, bucket, padded)

        def _capture_layer(self, bucket, layer, static_fb, static):
            if layer == 0:  # the first captured step recomputes the SWA indices from the live tables
                mr = self.model_runner
                swa_idx, r2t = static.core_attn_metadata.swa_page_indices, mr.req_to_token_pool.req_to_token
                f2s = mr.token_to_kv_pool.full_to_swa_index_mapping
                rows, positions = self.row_pool_idx[bucket], self.static_positions[bucket]

                def in_graph_metadata():
                    swa_idx.copy_(swa_window_indices(r2t, f2s, rows, positions, mr.dims.swa_window)[0])

                mr.device.launch("in_graph_metadata", in_graph_metadata,
                                 reads={"req_to_token": None, "full_to_swa": None, "static_inputs": None},
                                 writes={"meta.swa_page_indices": None})
            PrefillGraphRunner._capture_layer(self, bucket, layer, static_fb, static)

        def _load_static_inputs(self, bucket, padded):
            PrefillGraphRunner._load_static_inputs(self, bucket, padded)
            rows, positions = self.row_pool_idx[bucket], self.static_positions[bucket]
            row_req = staged(padded.row_req, torch.int64, rows.device)
            self.model_runner.device.launch(
                "load_batch.row_pool_idx",
                lambda: (rows.copy_(padded.req_pool_indices.long()[row_req]), positions.copy_(padded.positions)),
                reads={"fb.req_pool_indices": None}, writes={"static_inputs": None})

        def __init__(self, model_runner, **kw):
            PrefillGraphRunner.__init__(self, model_runner, **kw)
            self.row_pool_idx, self.static_positions = {}, {}

    return _runner(graph_runner_cls=Runner)


@mutant("event_on_wrong_stream", "the read-done event is recorded on the schedule stream, not the forward stream",
        "#29541 ordering chain", "happens-before")
def _event_on_wrong_stream() -> Classes:
    def on_schedule_stream(model_runner, device):
        with device.stream(device.schedule_stream):
            runners.record_and_publish(model_runner, device)

    def publish(model_runner, ends, device):
        if (ends is SharedReadEnds.PRE_REPLAY and model_runner.spec_algorithm.supports_prefill_shared_read_done()
                and not model_runner.flags.offloads_kv()):
            on_schedule_stream(model_runner, device)

    def publish_pr(model_runner, fb, device):
        before = model_runner.shared_read_done_event
        model_runner.shared_read_done_event = None
        runners.maybe_publish_prefill_shared_read_done_pr(model_runner, fb, device)
        if model_runner.shared_read_done_event is None:
            model_runner.shared_read_done_event = before
        else:
            on_schedule_stream(model_runner, device)

    return _runner(publish=staticmethod(publish), publish_pr=staticmethod(publish_pr))


@mutant("stale_event", "the scheduler consumes an event without clearing it, so a later batch waits on a stale one",
        "#34916 mailbox", "happens-before")
def _stale_event() -> Classes:
    class Stale(Scheduler):
        def _apply_war_barrier(self):
            runner = self.last_shared_read_runner
            event = runner.shared_read_done_event
            super()._apply_war_barrier()
            runner.shared_read_done_event = event  # the bug: waited on, then left in the mailbox

    return Classes(scheduler=Stale)


@mutant("offload_gate_missing", "the hierarchical-cache / storage / LMCache gate is missing", "#36738", "differential")
def _offload_gate_missing() -> Classes:
    def publish(model_runner, ends, device):
        if ends is SharedReadEnds.PRE_REPLAY and model_runner.spec_algorithm.supports_prefill_shared_read_done():
            runners.record_and_publish(model_runner, device)

    def publish_pr(model_runner, fb, device):
        flags = model_runner.flags
        model_runner.flags = replace(flags, hierarchical_cache=False, hicache_storage=False, lmcache=False)
        try:
            runners.maybe_publish_prefill_shared_read_done_pr(model_runner, fb, device)
        finally:
            model_runner.flags = flags

    return _runner(publish=staticmethod(publish), publish_pr=staticmethod(publish_pr))


@mutant("padded_rows_live_slot", "padded rows write to the last real token's slot instead of the dummy slot 0",
        "PaddingPolicy.ZERO", "kv")
def _padded_rows_live_slot() -> Classes:
    class Runner(PrefillGraphRunner):
        def _pad(self, fb, bucket):
            padded = runners.pad_forward_batch(fb, bucket)
            padded.out_cache_loc[fb.num_tokens:] = fb.out_cache_loc[-1]
            return padded

    return _runner(graph_runner_cls=Runner)


@mutant("pool_reuse_before_barrier", "result processing frees and reuses pool rows before the WAR barrier",
        "#31687 / #18803", "happens-before")
def _pool_reuse_before_barrier() -> Classes:
    class Early(Scheduler):
        def event_loop_step(self, fb, *, graph, process_batch_result, after_launch=lambda: None):
            dev = self.device
            with dev.stream(dev.forward_stream):
                outputs = self.model_runner.forward(fb, graph=graph)
            after_launch()
            with dev.stream(dev.schedule_stream):
                process_batch_result()
            self._apply_war_barrier()
            if self.flags.offloads_kv():
                with dev.stream(dev.schedule_stream):
                    outputs["host_kv"] = self._backup_kv()
            return outputs

    return Classes(scheduler=Early)


@mutant("scheduler_no_wait", "the scheduler does not wait at all", "#26380 (before the barrier)", "happens-before")
def _scheduler_no_wait() -> Classes:
    class NoWait(Scheduler):
        def _apply_war_barrier(self):
            self.last_shared_read_runner.shared_read_done_event = None

    return Classes(scheduler=NoWait)


@mutant("mixed_publishes", "MIXED mode publishes (its decode rows read the tables inside the forward)",
        "#34052 gate unification", "happens-before")
def _mixed_publishes() -> Classes:
    def resolve_prefill_shared_read_ends(self, fb, *, num_qo_tokens, build_snapshot=True):
        if fb.forward_mode is ForwardMode.MIXED:
            fb = replace(fb, forward_mode=ForwardMode.EXTEND)
        return AttentionBackend.resolve_prefill_shared_read_ends(self, fb, num_qo_tokens=num_qo_tokens,
                                                                 build_snapshot=build_snapshot)

    def prepare_prefill_shared_read_snapshot(self, fb, *, num_qo_tokens):
        if fb.forward_mode is ForwardMode.MIXED:
            fb = replace(fb, forward_mode=ForwardMode.EXTEND)
        DeepseekV4AttnBackend.prepare_prefill_shared_read_snapshot(self, fb, num_qo_tokens=num_qo_tokens)

    def shared_read_ends(self, forward_mode):
        if forward_mode is ForwardMode.MIXED:
            forward_mode = ForwardMode.EXTEND
        return DeepseekV4AttnBackend.shared_read_ends(self, forward_mode)

    def publish_pr(model_runner, fb, device):
        if fb.forward_mode is ForwardMode.MIXED:
            fb = replace(fb, forward_mode=ForwardMode.EXTEND)
        runners.maybe_publish_prefill_shared_read_done_pr(model_runner, fb, device)

    backend = type("MutantBackend", (DeepseekV4AttnBackend,), {
        "resolve_prefill_shared_read_ends": resolve_prefill_shared_read_ends,
        "prepare_prefill_shared_read_snapshot": prepare_prefill_shared_read_snapshot,
        "shared_read_ends": shared_read_ends})
    return _runner(backend_cls=backend, publish_pr=staticmethod(publish_pr))


@mutant("fast_path_lost", "plain (non-speculative) EXTEND never publishes: the coarse barrier every step",
        "#34816 (DSPARK never published)", "policy")
def _fast_path_lost() -> Classes:
    def publish(model_runner, ends, device):
        if model_runner.spec_algorithm.is_none():
            return
        runners.maybe_publish_prefill_shared_read_done(model_runner, ends, device)

    def publish_pr(model_runner, fb, device):
        if model_runner.spec_algorithm.is_dspark():
            return
        runners.maybe_publish_prefill_shared_read_done_pr(model_runner, fb, device)

    return _runner(publish=staticmethod(publish), publish_pr=staticmethod(publish_pr))


# -- stale state across steps (issue 30): found by the `freshness` oracle ------------------------------------

@mutant("metadata_kept_across_idle", "an idle step without rows keeps the previous batch's metadata, and the idle "
        "forward runs with it (the drop of every release's EagerRunner._execute_idle reverted)",
        "issue 30 (SGLang: an SWA use-after-free otherwise)", "freshness")
def _metadata_kept_across_idle() -> Classes:
    def execute_idle(self):
        self.probe.note(PlanRead(PlanKind.METADATA, getattr(self.attn_backend.forward_metadata, "plan", None)))
        return {}

    return _runner(execute_idle=execute_idle)


@mutant("cache_kept_across_bucket_change", "a replay whose bucket is not the one replayed last keeps the chunk cache "
        "its captured metadata held (the reset runs only on a same-bucket replay)", "issue 30", "freshness")
def _cache_kept_across_bucket_change() -> Classes:
    class Runner(PrefillGraphRunner):
        last_bucket = None

        def _prepare_forward_metadata_for_replay(self, padded, static):
            kept = static.sparse_prefill_cache
            PrefillGraphRunner._prepare_forward_metadata_for_replay(self, padded, static)
            if self.last_bucket not in (None, padded.num_tokens):
                static.sparse_prefill_cache = kept
            self.last_bucket = padded.num_tokens

    return _runner(graph_runner_cls=Runner)


# -- a lost fast path no value shows (issue 30): found by the `fast-path` oracle alone -----------------------

@mutant("event_after_layers", "the read-done event is recorded after the layers: it fires with the whole forward",
        "issue 30 (the event kept, the overlap lost)", "fast-path")
def _event_after_layers() -> Classes:
    def publish(model_runner, ends, device):
        model_runner.deferred_publish = lambda: runners.maybe_publish_prefill_shared_read_done(model_runner, ends,
                                                                                               device)

    def publish_pr(model_runner, fb, device):
        model_runner.deferred_publish = lambda: runners.maybe_publish_prefill_shared_read_done_pr(model_runner, fb,
                                                                                                  device)

    def run_model(self, fb, store_compressed=None):
        out = ModelRunner.run_model(self, fb, store_compressed=store_compressed)
        deferred, self.deferred_publish = getattr(self, "deferred_publish", None), None
        if deferred is not None:
            deferred()
        return out

    return _runner(publish=staticmethod(publish), publish_pr=staticmethod(publish_pr), run_model=run_model)


@mutant("barrier_ignores_event", "the barrier reads the mailbox of a runner that never publishes (EAGLE v2's draft "
        "runner), so it always falls back to the coarse barrier", "issue 30 (DESIGN: last_shared_read_runner)",
        "fast-path")
def _barrier_ignores_event() -> Classes:
    class DraftMailbox(Scheduler):
        @property
        def last_shared_read_runner(self):
            if not hasattr(self, "_draft_runner"):
                self._draft_runner = type("DraftRunner", (), {"shared_read_done_event": None})()
            return self._draft_runner

    return Classes(scheduler=DraftMailbox)


@mutant("barrier_waits_forward_after_publish", "the barrier waits on the event and then on the whole forward stream",
        "issue 30 (a belt-and-braces wait)", "fast-path")
def _barrier_waits_forward_after_publish() -> Classes:
    class BeltAndBraces(Scheduler):
        def _apply_war_barrier(self):
            super()._apply_war_barrier()
            self.device.wait_stream(self.device.schedule_stream, self.device.forward_stream)

    return Classes(scheduler=BeltAndBraces)
