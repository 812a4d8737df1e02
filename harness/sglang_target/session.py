"""The session of `--target sglang`: the harness's world driven through the real SGLang code of the installed release.

Two paths, chosen per batch (`SglangModelRunner.runs_real`):

- on every release, an eager EXTEND batch (a MIXED one too, which SGLang's eager
  runner runs as EXTEND), DECODE batch or TARGET_VERIFY batch (as SGLang's ragged verify: `_as_verify`) with
  neither CP nor HiSparse, on either device, runs SGLang's own `DeepseekV4AttnBackend`, built by its `__init__` over
  SGLang's own `DeepSeekV4TokenToKVPool`: its `init_forward_metadata`, its resolver (the PR-era hook on 0.5.19 to
  0.5.22) and chunk-cache build, and per layer its `forward` (store, sparse or dense attention), with only compiled
  code stood in (`real_backend.py`, `eager.py`; on CUDA SGLang's JIT kernels compile and run, FlashMLA is stood in
  where its wheel does not load).
  Such a batch replayed by the breakable graph (`bcg`) does too: SGLang's `PrefillCudaGraphRunner`, built by its
  own `__init__`, captures the bucket at start-up (`capture_one_shape`, the backend's capture init) and refreshes
  it per replay (the backend's own prep), the captured segments read what the capture bound (`graph_runner.py`,
  `real_graph.py`). Its KV is in SGLang's pool, which `kv_state` decodes;
- with EAGLE's draft model (EAGLE, EAGLE3, NEXTN, STANDALONE), the draft extend after such a prefill batch (EXTEND or
  MIXED: `EAGLEWorkerV2._draft_extend_for_prefill`) runs SGLang's own draft runner (`SglangDraftRunner`): a pool and
  backend built by their `__init__`s as a draft worker's (`is_draft_worker`, DSV4's NextN model, one SWA-only
  layer) over the same tables, SGLang's eager runner, the draft backend's metadata init, resolver and forward; and
  a draft-extend batch whose requests are all the server's draft width (`EAGLEWorkerV2._draft_extend_for_decode`)
  runs it as a `DRAFT_EXTEND_V2` batch, eagerly or replayed by SGLang's own `EAGLEDraftExtendCudaGraphRunner`
  (`draft_graph.py`: its capture, `execute`, publish and the recorded in-graph metadata step);
- every other batch (CP and HiSparse cases, tc_piecewise replays on the releases that have them, the target's part
  of a draft-extend batch) runs the harness's metadata and layers over the same
  backend object, as listed under "Replaced" below; so does the draft extend after a decode or verify batch and of
  a draft-extend batch of uneven widths (`run_speculative_tail`, over the SWA latents SGLang's forward stored where
  it ran).

From 0.5.22 DSV4's prefill graph is the breakable one only (the tc_piecewise prefill backend was removed, and
DSV4's breakable graph replays its captured metadata): the target says so (`Target.graph_contracts`), so a
campaign replays every drawn case there under `bcg`, and a `fresh` replay is refused.

Real SGLang code on both paths, called on objects that carry what it reads (each entry point by file and
function):

- `model_executor/runner/eager_runner.py`: `EagerRunner.execute` and through it `_execute_extend`,
  `_execute_decode`, `_execute_idle` and `load_batch` with its static-buffer registry
  (`cuda_graph_buffer_registry.build_eager_registry`); the MIXED -> EXTEND rewrite, the metadata-init
  condition, the resolve -> publish order and the event's device module are SGLang's;
- `model_executor/model_runner.py`: `ModelRunner._extend_forward_kwargs`, `_pp_kwargs`;
- `model_executor/runner/prefill_cuda_graph_runner.py`: on 0.5.23 `PrefillCudaGraphRunner.__init__` and its start-up
  `capture` (`graph_runner.py`); `PrefillCudaGraphRunner.can_run_graph` (through it
  `can_replay_locally`) and `execute`, and through it `load_batch` (the bucket by `_pad_to_bucket`, the
  static-buffer registry of `cuda_graph_buffer_registry.build_prefill_registry` and its `fill_from` with
  SGLang's padding, the static batch, the breakable static buffers), `_prepare_forward_metadata_for_replay`,
  the publish, `_execute_tc_piecewise` / `_execute_body_capture` and `_finalize_execute_output` (the trim to
  the live rows); the graph backends `TcPiecewiseCudaGraphBackend` / `BreakableCudaGraphBackend` but for
  their `replay`; `mem_cache/kv_index_translator.py`: `KVIndexTranslator.own_plan` and the plan's `bind` /
  `bind_replay`; `arg_groups/cuda_graph_hook.py`: `generate_prefill_cuda_graph_batch_sizes`;
- `layers/attention/base_attn_backend.py`: `AttentionBackend.resolve_prefill_shared_read_ends`;
  `layers/attention/deepseek_v4_backend.py`: `DeepseekV4AttnBackend._snapshot_prefill_shared_reads`,
  `_use_sparse_prefill`, `shared_read_ends`, `_build_sparse_prefill_chunk_cache`, `get_swa_out_cache_loc`;
  `DSV4Metadata` around a real `DSV4AttnMetadata`, with their own `copy_` and
  `refresh_for_breakable_cuda_graph_replay_` (which fields are copied in place and which re-bound);
- `layers/attention/dsv4/sparse_prefill_utils.py`: `SparsePrefillChunkCache.build`, `ensure_c128`,
  `ensure_compressed`, `combine_compressed`; `kernels/ops/attention/dsv4/sparse_prefill_kernels.py`: the Triton
  kernels `build_swa_token_ids`, `combine_topk_swa_indices` (interpreted on the CPU simulator, compiled on CUDA);
- `model_executor/runner_utils/shared_read_event.py`: `maybe_publish_prefill_shared_read_done`;
- `managers/scheduler.py`: `Scheduler.run_event_loop` (the barrier's enabling, its own expression),
  `event_loop_overlap`, `is_disable_overlap_for_batch`, `_apply_war_barrier` (see `scheduler.py` here);
  `managers/tp_worker.py` / `speculative/base_spec_worker.py` / `speculative/eagle_worker_v2.py`:
  `last_shared_read_runner`;
- `speculative/eagle_draft_extend_cuda_graph_runner.py`: `EAGLEDraftExtendCudaGraphRunner.capture_one_shape` (its
  `run_once`, replayed), `can_run_graph`, `execute`; `speculative/eagle_info.py`: `EagleDraftExtendInput`;
- `speculative/spec_info.py`: `SpeculativeAlgorithm`; `environ.py`: the env flags; `runtime_context.py`:
  the configuration namespaces; `layers/cp/`: `is_cp_active`, `get_cp_strategy`.

Replaced, with the reason (each compared with the real code in tests/test_sglang_target.py where both run):

- the model above the attention backend (`model_runner.model`): the harness's layers. On the real path they
  only make each layer's inputs (q, the SWA latent, the compressed latents, the indexer's scores) and call
  SGLang's backend; on the other path they also attend, fed with the real metadata and chunk cache, FlashMLA
  (`flash_mla_sparse_fwd`) replaced by the harness's sparse kernel over the real combined indices;
- on the other path only: `init_forward_metadata` / `prepare_forward_metadata_for_breakable_cuda_graph_replay`
  (the real ones run for an eager batch and a breakable replay of the real path): the harness fills the real
  `DSV4AttnMetadata`'s
  fields from its own gathers; the copy into a graph's static metadata and the breakable-graph refresh are
  SGLang's own methods; `_build_sparse_prefill_chunk_cache` is deferred: the real method runs inside a
  launched operation on the forward stream, so on the simulator it reads the tables when the stream reaches it;
- the captured graphs of the prefill graph runner (its capture needs the model): the graph backend's
  `replay` runs the layers over SGLang's static batch; on the other path the harness's, with captured KV stores
  that keep the capture's tensors (`CapturedGraphs`), on the real path SGLang's forward with the captured
  segments of `real_graph.py`; its `capture_one` keeps what a graph holds. On the real path the runner is built
  by SGLang's `__init__` and captures at start-up the buckets the case pads to, with the CUDA-graph machinery
  stood in (`graph_runner.py` lists each piece); on the other path (a tc_piecewise replay, to 0.5.21)
  the runner is built with the fields its `__init__` sets and a bucket is captured when SGLang's replay first asks
  for it;
- on one rank, what a server's published configuration decides: `ModelRunner.attn_tp_sequence_sharded`
  (False), the capture list's alignment to the ranks (`get_prefill_num_tokens_to_capture`: the identity),
  on the PR-era releases DSV4's `can_run_prefill_cuda_graph` (its context limit is unset by default: True; on
  0.5.23 the runner's `__init__` takes the real one); no test compares
  these three with the real functions, which read a server's published MoE, DP, TP and exec
  configuration that the harness does not publish;
- on the other path, the KV stores and the indexer (model parts); on both, the scheduler's request intake,
  batch selection and result processing (the harness's mutator);
- on the CPU simulator, the device module (`torch.streamsim`, see `platform.py`): events recorded on the
  stream given, or the current one, as CUDA does; on CUDA, nothing: real `torch.cuda.Event`s.

Tensor work the harness issues goes through `device.launch` with its reads and writes declared; real
SGLang code that works on tensors eagerly on the host (metadata init and the resolver on the real path, the
metadata copy and refresh) runs as host work on the current stream, after what the stream was given before it
(`Device.host_work`); on the real path each layer's `forward` is one launch, observed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from types import MethodType, SimpleNamespace
from typing import Any, Optional

import torch

from harness.case import Case
from harness.device import DeviceKind
from harness.errors import InvalidArgument
from harness.model.attention import sparse_attention_on
from harness.model.backend import page_slot
from harness.model.enums import ForwardMode as HForwardMode
from harness.model.pools import ForwardBatch
from harness.probe import (Dispatch, Forward, LazyBuild, MetadataReuse, PlanKind, Publish, Snapshot,
                           SwaLocFallback)
from harness.sglang_target import server
from harness.sglang_target.draft_graph import SglangDraftExtendGraphRunner
from harness.sglang_target.eager import EagerPath
from harness.sglang_target.graph_runner import SglangPrefillGraphRunner
from harness.sglang_target.plans import Plans
from harness.sglang_target.real_backend import RealDsv4, fixed_dims
from harness.sglang_target.platform import (CudaEventBridge, SimDeviceModule, SimStream, one_dp_rank,
                                            register_sim_device, sglang_config, swa_window)
from harness.sglang_target.scheduler import SchedulerShell, ShellBatch
from harness.targets import Classes, ReferenceSession

_MODE_NAMES = {HForwardMode.DRAFT_EXTEND: "DRAFT_EXTEND_V2"}
# The modes whose eager batches run SGLang's metadata init and forward (`SglangModelRunner.runs_real`).
_REAL_MODES = (HForwardMode.EXTEND, HForwardMode.MIXED, HForwardMode.DECODE, HForwardMode.TARGET_VERIFY)
# The modes of a prefill batch, after whose target forward EAGLE's worker runs the draft extend
# (`EAGLEWorkerV2.forward_batch_generation`: `batch.forward_mode.is_extend()`).
_PREFILL_MODES = (HForwardMode.EXTEND, HForwardMode.MIXED)
# What SGLang's metadata copy_ / refresh read: the fresh metadata, and through its raw_out_loc (a reference
# to the batch's out_cache_loc, as in SGLang) the batch's own tensor.
_METADATA_SOURCES = {"meta.fresh": None, "fb.out_cache_loc": None}


@dataclass
class DeferredChunkCache:
    """What the real `_build_sparse_prefill_chunk_cache` returns, filled when its launched closure runs."""

    num_qo_tokens: int
    label: str
    value: Any = None

    def get(self):
        if self.value is None:
            raise RuntimeError(f"the sparse prefill chunk cache ({self.label}) was read before its build ran")
        return self.value


# -- the chunk cache's compressed-layer inputs, by API generation ------------------------------------------

def _c128_inputs_compressed(cache, core_view, c128):
    """0.5.21 on: `layer_inputs` gathers every c128 block and combines once per chunk."""
    flat, idx, _ = cache.layer_inputs(128, core_view, 1)
    return flat, idx


def _c4_inputs_compressed(cache, block_table, raw4):
    """0.5.21 on: the gather once per chunk (`ensure_compressed`), the combine per layer."""
    flat = cache.ensure_compressed(4, block_table, 1).flat_token_ids
    idx, _ = cache.combine_compressed(4, raw4)
    return flat, idx


def _c128_inputs_c4_era(cache, core_view, c128):
    """0.5.19 and 0.5.20: `ensure_c128` fills the cache's c128 fields."""
    cache.ensure_c128(c128)
    return cache.c128_flat_token_ids, cache.c128_combined_indices


def _c4_inputs_c4_era(cache, block_table, raw4):
    """0.5.19 and 0.5.20: `ensure_c4` then `combine_c4_layer`."""
    cache.ensure_c4(block_table, 1)
    idx, _ = cache.combine_c4_layer(c4_sparse_raw_indices=raw4)
    return cache.c4_flat_token_ids, idx


_COMPRESSED_INPUTS = {"compressed": (_c128_inputs_compressed, _c4_inputs_compressed),
                      "c4": (_c128_inputs_c4_era, _c4_inputs_c4_era)}


# -- shims --------------------------------------------------------------------------------------------------

class _Worker:
    """A model worker whose `last_shared_read_runner` is the real property of `cls`."""

    def __init__(self, cls, **attrs):
        self._prop = cls.__dict__["last_shared_read_runner"]
        self.__dict__.update(attrs)

    @property
    def last_shared_read_runner(self):
        return self._prop.fget(self)


class HarnessLayers:
    """`model.model`: the transformer body (SGLang's breakable graph runner resolves it as the module that owns
    the decoder `layers`, and replaces its `forward` by the captured graph's replay). Its output is the attention
    of every layer, rows first."""

    def __init__(self, model_runner: "SglangModelRunner"):
        self.mr = model_runner
        self.layers = tuple(range(len(model_runner.case.dims.layer_ratios)))  # the harness's layers, by index

    def forward(self, input_ids, positions, forward_batch, *args, **kwargs) -> torch.Tensor:
        mr = self.mr
        mr.bridge_delay()
        fb = mr.replay_batch if mr.replay_batch is not None else mr.live_batch
        if fb is None:
            raise RuntimeError("SGLang called the model's forward outside a batch of the harness")
        if forward_batch.forward_mode.is_idle():  # the forward runs over no rows with what the backend holds
            mr.plans.read(PlanKind.METADATA, mr.attn_backend.forward_metadata)
            dims = mr.case.dims
            return torch.zeros(0, len(dims.layer_ratios), dims.heads, dims.head_dim)
        if mr.real_batch:
            return mr.eager.layers(fb, forward_batch).transpose(0, 1)
        return mr.run_model(fb, forward_batch).transpose(0, 1)


class HarnessModel:
    """`model_runner.model`: what SGLang's runners call for the forward; the body is the harness's layers, the
    output SGLang's `LogitsProcessorOutput` with the layers' attention as its hidden states (no logits)."""

    shared_experts_config = None  # what BaseRunner.model_context reads

    def __init__(self, model_runner: "SglangModelRunner"):
        self.mr = model_runner
        self.model = HarnessLayers(model_runner)

    def forward(self, input_ids, positions, forward_batch, **kwargs):
        return self.logits_output(self.model.forward(input_ids, positions, forward_batch))

    def logits_output(self, hidden_states: torch.Tensor):
        return self.mr.api.mods["logits"].LogitsProcessorOutput(next_token_logits=None, hidden_states=hidden_states)


# -- the session --------------------------------------------------------------------------------------------

class SglangSession(ReferenceSession):
    """The tables, world loading and the harness's model parts come from the reference session (and its pools,
    for the batches the harness's layers run); the runner, the backend (on 0.5.23 built by its `__init__` over
    SGLang's own KV pool, and for an eager EXTEND batch its metadata init and forward), the metadata's copy and
    refresh, the decisions, the snapshot, the publication and the scheduler's loop and barrier are SGLang's."""

    @property
    def contract_entry_points(self) -> tuple[str, ...]:
        """What triage checks on the real backend: the methods this target drives for real, the installed
        release's hook, its metadata init and its forward among them."""
        return self.api.generation.hook, "shared_read_ends", "init_forward_metadata", "forward"

    def __init__(self, api, case: Case, device):
        if case.semantics != api.semantics:
            raise InvalidArgument(f"case semantics={case.semantics.value!r}: the installed {api.describe()} implements "
                                  f"semantics={api.semantics.value!r} only")
        api.check_device(device.kind)
        if case.flags.cp_active and not api.generation.runs_cp:
            raise InvalidArgument(f"case flags.cp_active=true: the installed {api.describe()} shards a CP batch "
                                  "across ranks in its eager runner, which one process cannot run; allowed: false")
        if case.graph_contract not in api.graph_contracts and any(b.graph for b in case.batches):
            raise InvalidArgument(f"case graph_contract={case.graph_contract!r}: allowed: "
                                  f"{', '.join(api.graph_contracts)} (sglang {api.version} replays DSV4's prefill graph "
                                  "as the breakable graph over its captured metadata; tc_piecewise, whose replay plans "
                                  "fresh metadata, was removed in 0.5.22)")
        fixed = fixed_dims(api)
        for name, value in fixed.items():
            if getattr(case.dims, name) != value:
                raise InvalidArgument(f"case dims.{name}={getattr(case.dims, name)!r}: the installed {api.describe()} "
                                      f"runs at {', '.join(f'{k}={v!r}' for k, v in fixed.items())} only")
        super().__init__(case, device, Classes())
        self.api = api
        self.harness_runner = self.model_runner  # the harness model: metadata init, KV stores, indexer, readers
        server.publish(api, device.kind.value)
        self.bridge = CudaEventBridge(device) if device.kind is DeviceKind.CUDA else None
        self.model_runner = SglangModelRunner(self)
        # EAGLE's draft extend after a prefill, through SGLang's draft runner, in a case whose prefills run SGLang's
        # own backend (`real_case`); otherwise, and after any other batch, the harness's (`run_speculative_tail`).
        self.draft_runner = (SglangDraftRunner(self, self.model_runner)
                             if case.spec.is_eagle_family() and self.model_runner.real_case else None)
        self.scheduler = self._scheduler_shell(api, device)

    def _scheduler_shell(self, api, device) -> SchedulerShell:
        """SGLang's scheduler loop over the model worker it would have: the TP worker without speculative decoding;
        with EAGLE's draft model running (`draft_runner`) `EAGLEWorkerV2`, whose `last_shared_read_runner` is the
        draft runner (the step's last shared-table reader, so the barrier asks its mailbox); any other speculative
        algorithm, and EAGLE where the harness's tail stands in for the draft (CP, HiSparse), the base spec
        worker's (the target runner)."""
        mr = self.model_runner
        if mr.spec_algorithm.is_none():
            worker = _Worker(api.mods["tp_worker"].BaseTpWorker, model_runner=mr)
        elif self.draft_runner is not None:
            worker = _Worker(api.mods["eagle_worker"].EAGLEWorkerV2, _target_worker=SimpleNamespace(model_runner=mr),
                             _draft_worker=SimpleNamespace(draft_runner=self.draft_runner))
        else:
            worker = _Worker(api.mods["spec_worker"].BaseSpecWorker, target_worker=SimpleNamespace(model_runner=mr))
        # The scheduler's streams as SGLang holds them: torch's own on CUDA, the simulator's otherwise.
        if self.bridge is None:
            streams = [SimStream(device, s) for s in (device.schedule_stream, device.forward_stream)]
        else:
            streams = [self.bridge.stream(s) for s in (device.schedule_stream, device.forward_stream)]
        return SchedulerShell(api, device_module=mr.device_module, schedule_stream=streams[0],
                              forward_stream=streams[1], model_worker=worker, harness_device=device,
                              harness_stream=self._harness_stream, models_cuda=device.kind is DeviceKind.CUDA)

    def load(self, world) -> ForwardBatch:
        """The reference's allocation, with the per-batch tensors in SGLang's dtypes: `seq_lens` and
        `req_pool_indices` are int64 in ScheduleBatch/ForwardBatch (`extend_seq_lens` int32, as here); the
        prefix's KV also in SGLang's pool, where an eager EXTEND batch reads it."""
        fb = super().load(world)
        for runner in self._sglang_runners():
            runner.eager.load(world)
        return dataclasses.replace(fb, seq_lens=fb.seq_lens.to(torch.int64),
                                   req_pool_indices=fb.req_pool_indices.to(torch.int64))

    def kv_state(self) -> dict[str, torch.Tensor]:
        """The KV the last forward wrote: SGLang's pool, decoded, after a batch of the real path; the harness's
        pools after any other (a tc_piecewise replay, a decode, ... run the harness's layers)."""
        if self.model_runner.ran_real:
            return self.model_runner.eager.kv_state()
        return super().kv_state()

    def observed_buffers(self) -> dict[str, torch.Tensor]:
        """What the observer watches, by the names the declarations use: the tables, SGLang's KV buffers
        (`swa_kv[layer]`, `extra_kv[layer]`; the draft runner's `draft_swa_kv[0]`) and the harness's indexer-K store."""
        tables = {name: getattr(self, name) for name in ("req_to_token", "full_to_swa", "full_to_hisparse")}
        pools = {name: buffer for runner in self._sglang_runners()
                 for name, buffer in runner.eager.real.buffers().items()}
        return {**tables, **pools, "indexer_k": self.token_to_kv_pool.indexer_k}

    def _sglang_runners(self) -> list["SglangModelRunner"]:
        """The model runners over SGLang's pools: the target's, and the draft's where EAGLE's draft extend runs."""
        return [self.model_runner] + ([self.draft_runner] if self.draft_runner is not None else [])

    def step(self, fb, *, graph, process_batch_result, after_launch):
        """One batch through SGLang's overlap loop: its run_batch is the session's forward."""
        mr = self.model_runner
        batch = ShellBatch(mr.sglang_mode(fb), mr.spec_algorithm, fb)
        uses = len(self.api.stand_ins.uses)
        try:
            with sglang_config(self.api, self.case), mr.device_binding():
                return self.scheduler.iterate(batch, forward=lambda: self.forward(fb, graph=graph),
                                              process=process_batch_result, after_launch=after_launch,
                                              stash=lambda: self._stash_chunk_to_lmcache(fb))
        finally:
            self.api.stand_ins.check_unused(uses)

    def _stash_chunk_to_lmcache(self, fb: ForwardBatch) -> Optional[dict[str, torch.Tensor]]:
        """With LMCache on, from 0.5.21: the scheduling step after a chunk of a chunked prefill ran stashes the
        request (`stash_chunked_request`), and LMCache's cache stores the chunk (`_submit_store` ->
        `lmcache_connector.submit_store`, no producer stream: its transfer waits on an event recorded on the
        current stream, the schedule stream; lmcache_unified_radix_cache.py, 0.5.21 L947, 0.5.22 L938). The
        harness takes an EXTEND batch's last request as such a chunk (chunked prefill is on wherever prompts
        are long) and issues the store's read of its KV where the stash runs; the stored copy is an output."""
        if not (self.case.flags.lmcache and self.api.generation.stores_stashed_chunk
                and fb.forward_mode is HForwardMode.EXTEND and fb.batch_size):
            return None
        pool, last = self.token_to_kv_pool, fb.batch_size - 1
        rows = [t for t, req in enumerate(fb.row_req[:fb.num_tokens]) if req == last]
        full_slots = fb.out_cache_loc[rows]
        stored = torch.zeros(pool.swa_kv.shape[0], len(rows), pool.swa_kv.shape[2], device=pool.swa_kv.device)
        f2s = pool.full_to_swa_index_mapping
        # The chunk's KV where its forward wrote it: SGLang's pool after a batch of the real path, else the harness's.
        real = self.model_runner.eager.real if self.model_runner.ran_real else None

        def store():
            swa_kv = real.read_swa() if real is not None else pool.swa_kv
            stored.copy_(swa_kv[:, f2s[full_slots]])

        self.device.launch("lmcache.store(stashed chunk)", store,
                           reads={"full_to_swa": None, **{f"swa_kv[{layer}]": None
                                                          for layer in range(pool.swa_kv.shape[0])}},
                           writes={"lmcache.host": None})
        return {"lmcache_stored_chunk": stored}

    def _harness_stream(self):
        """The harness stream SGLang's code is on now: the simulator's current one, or torch's on CUDA."""
        if self.bridge is None:
            return self.device.current_stream
        return self.bridge.stream_of(torch.cuda.current_stream().cuda_stream)

    def _note_publication(self) -> None:
        """What the runner left in its mailbox for the scheduler's barrier: the publication of this batch
        (or a stale one), with the stream its event was recorded on."""
        event = self.model_runner.shared_read_done_event
        if event is None:
            return
        if self.bridge is None:
            stream, recorded = getattr(event, "stream", None), getattr(event, "recorded", None)
        else:
            recorded, stream = self.bridge.where_recorded(event) or (None, None)
        self.probe.note(Publish(stream=stream.name if stream is not None else f"none ({type(event).__name__})",
                                event=recorded.id if recorded is not None else None))

    def forward(self, fb: ForwardBatch, *, graph: bool) -> dict[str, torch.Tensor]:
        mr, dev = self.model_runner, self.device
        self.probe.note(Dispatch(mode=fb.forward_mode.name, tokens=fb.num_tokens))
        with dev.stream(dev.forward_stream):
            out = mr.forward(fb, graph=graph)
            self._note_publication()
            if fb.forward_mode.is_idle():
                return {}
            outputs = {"attention": out}
            if self.draft_runner is not None and fb.forward_mode in _PREFILL_MODES:
                outputs["draft_extend"] = self.draft_runner.draft_extend(fb)
                return outputs
            if self.draft_runner is not None and runs_sglangs_draft_extend(
                    fb.forward_mode, fb.extend_seq_lens_cpu, draft_extend_width(self.case)):
                outputs["draft_extend"] = self.draft_runner.draft_extend_v2(fb, graph=graph)
                return outputs
            tail_metadata = self._tail_metadata(fb, mr.attn_backend.forward_metadata)
            self.harness_runner.attn_backend.forward_metadata = tail_metadata
            if mr.ran_real and self.case.spec.is_eagle_family():
                self._swa_kv_for_tail()
            outputs.update(self.harness_runner.run_speculative_tail(fb))
        return outputs

    def _swa_kv_for_tail(self) -> None:
        """The harness's draft extend (after a decode or verify batch) reads the harness's pool: where SGLang's forward
        wrote this batch's KV into SGLang's pool, the SWA latents are copied from there first (decoded), so the draft
        attends over what the target's forward stored, as the reference's does (the harness's pool holds only the
        history the batch was loaded with)."""
        real, swa_kv = self.model_runner.eager.real, self.token_to_kv_pool.swa_kv

        def copy():
            swa_kv.copy_(real.read_swa()[:, : swa_kv.shape[1]])

        self.device.launch("draft_extend.swa_kv_from_sglangs_pool", copy,
                           reads=dict.fromkeys(name for name in real.buffers() if name.startswith("swa_kv")),
                           writes={})

    def _tail_metadata(self, fb: ForwardBatch, metadata):
        """The metadata the speculative tail (the harness's, `run_speculative_tail`) reads: SGLang's, or where SGLang
        kept no SWA write locations in it (a PR-era breakable replay: its captured metadata has none, and
        `get_swa_out_cache_loc` re-translated the batch's `out_cache_loc` through the live mapping at every layer's
        store) a view whose locations are that translation, made the same way after the forward."""
        core = metadata.core_attn_metadata
        if core.swa_out_cache_loc is not None or not self.case.spec.is_dflash_family():
            return metadata
        f2s, loc = self.token_to_kv_pool.full_to_swa_index_mapping, fb.out_cache_loc
        with self.device.host_work("draft_kv_inject.translate_loc_from_full_to_swa",
                                   reads={"full_to_swa": None, "fb.out_cache_loc": None},
                                   writes={"meta.swa_out_cache_loc": None}):
            swa_loc = f2s[loc].to(torch.int32)
        return SimpleNamespace(core_attn_metadata=SimpleNamespace(swa_out_cache_loc=swa_loc))

    def chunk_cache(self):
        """The real SparsePrefillChunkCache of the last forward, if one was built (after synchronize)."""
        metadata = self.model_runner.attn_backend.forward_metadata
        holder = getattr(metadata, "sparse_prefill_cache", None)
        return holder.value if isinstance(holder, DeferredChunkCache) else holder


class SglangModelRunner:
    """What SGLang's ModelRunner is to the real code: the device, the spec algorithm, the backend, the
    model, the event mailbox and the runners."""

    is_draft_worker = False

    def __init__(self, session: SglangSession, *, probe=None, plans: Optional[Plans] = None):
        api, case, device = session.api, session.case, session.device
        self.session, self.api, self.case = session, api, case
        self.harness_device = device
        self.probe = probe if probe is not None else session.probe
        # the freshness oracle's plan numbers for SGLang's objects (one numbering per session: a draft runner's too)
        self.plans = plans if plans is not None else Plans(self.probe)
        self.harness = session.harness_runner
        # --speculative-algorithm as the server resolves it (NEXTN is EAGLE's alias; before 0.5.23 only there)
        cli_name = api.mods["spec_hook"]._resolve_speculative_algorithm_alias(case.spec.name, None)
        self.spec_algorithm = api.mods["spec"].SpeculativeAlgorithm.from_string(cli_name)
        self.shared_read_done_event = None
        self.device = device.kind.value if device.kind is DeviceKind.CUDA else register_sim_device()
        self.device_module = torch.get_device_module(self.device)
        self.device_timer = None
        self.support_pp, self.is_generation = False, True
        # one pipeline stage, starting at the first layer
        self.pp_group = SimpleNamespace(is_first_rank=True, is_last_rank=True, world_size=1, rank_in_group=0)
        self.layer_info = SimpleNamespace(start_layer=0)
        self.pp_size, self.pp_rank = 1, 0  # what 0.5.21's pipeline-proxy sizes read instead of `pp_group`
        self.graph_shared_output = None  # no logits buffer shared with the graphs: the harness has no logits
        # What the prefill graph runner's `__init__` reads of its model runner besides: no LoRA, no layer lists
        # for MoE or MHA companions (the harness's layers own none), the model's dtype, the published server.
        self.lora_manager, self.gpu_id, self.dtype = None, 0, torch.bfloat16
        self.attention_layers, self.mha_companion_layers, self.moe_layers, self.moe_fusions = [], [], [], []
        self.server_args = server.server_args()
        # `BaseRunner.warmup` before the start-up capture prepares the model's kernels (its all-reduce workspaces,
        # FlashInfer's autotune of its MoE and GEMMs): the harness's model has none, so the model runner is marked
        # warmed up, as SGLang marks it once its first runner warmed.
        self._kernel_warmed_up = True
        # One decode-context-parallel rank, as the PR-era eager runner asks it (0.5.21's name, then 0.5.19's); one
        # pipeline stage where 0.5.19's pipeline-proxy sizes read it (`ps`, its model runner's parallel state).
        self.attn_dcp_size = 1
        self.ps = SimpleNamespace(attn_dcp_size=1, pp_size=self.pp_size, pp_rank=self.pp_rank)
        # What the PR-era eager runner reads of the prefill graph runner: only on HIP, which is not modelled.
        self.prefill_cuda_graph_runner = None
        real = api.mods["model_runner"].ModelRunner
        for method in ("_pp_kwargs", "_extend_forward_kwargs", "prepare_dummy_forward_batch"):
            setattr(self, method, MethodType(getattr(real, method), self))
        # what the prefill graph runner's `__init__` asks of the pipeline (where the release has it)
        for method in ("get_pp_proxy_topk_size", "get_pp_proxy_residual_num_blocks", "get_pp_proxy_dspark_hidden_size"):
            if hasattr(real, method):
                setattr(self, method, MethodType(getattr(real, method), self))
        self.eager = self._real_backend()  # the real backend's path for the batches that run it
        self.token_to_kv_pool = self.eager.real.pool  # the KV pool SGLang's code sees: SGLang's own
        self.kv_index_translator = api.mods["kv_translator"].KVIndexTranslator(
            req_to_token=session.req_to_token_pool.req_to_token, token_to_kv_pool_allocator=None,
            token_to_kv_pool=self.token_to_kv_pool, page_size=case.dims.page_size, device=self.device)
        self._note_fallback(self.token_to_kv_pool)  # after the translator took the pool's own method
        # What the graph runner's capture reads of its model runner: SGLang's own request pool and config.
        real = self.eager.real
        self.req_to_token_pool, self.model_config = real.req_to_token_pool, real.model_config
        self.ngram_embedding_manager = real.ngram_embedding_manager
        self.model = HarnessModel(self)
        self.live_batch: Optional[ForwardBatch] = None  # the harness batch of the forward in flight
        self.replay_batch: Optional[ForwardBatch] = None  # its padded form during a graph replay
        self.replay_static = None  # the bucket's static metadata during a graph replay
        self._build_label = "sparse_prefill_cache.build"  # the next deferred build's launch, in the harness's layers
        self.real_batch = False  # the batch in flight runs SGLang's metadata init and forward (`eager`)
        self.ran_real = False  # the last batch did: its KV is in SGLang's pool
        self.attn_backend = self._build_backend()
        self.eager_runner = self._build_eager_runner()
        self.graph_runner = self._build_graph_runner()

    def model_layer_ratios(self) -> tuple[int, ...]:
        """The compress ratio of each attention layer of its model: the case's."""
        return self.case.dims.layer_ratios

    def _build_graph_runner(self) -> Optional[SglangPrefillGraphRunner]:
        return SglangPrefillGraphRunner(self, contract=self.case.graph_contract)

    @staticmethod
    def attn_tp_sequence_sharded(num_tokens: int) -> bool:
        """Replaced: one attention-TP rank, so no forward is sequence-sharded (the real one asks
        `require_gathered_buffer`, which reads the MoE, DP and TP configuration a server publishes)."""
        return False

    # -- the device the real code sees ---------------------------------------------------------

    @contextlib.contextmanager
    def building_graph_runner(self) -> Iterator[None]:
        """While SGLang's `PrefillCudaGraphRunner.__init__` runs, the model runner's `device` is the tensors' device:
        the runner allocates its buffers under `torch.device(self.device)`, which the simulator's device string
        (events and streams only) cannot hold. Its device module is set back to the simulator's afterwards."""
        saved, self.device = self.device, str(self.harness_device.torch_device)
        try:
            yield
        finally:
            self.device = saved

    def device_binding(self):
        session = self.session
        if session.bridge is not None:
            return session.bridge.bound()
        return SimDeviceModule.bind(self.harness_device)

    def bridge_delay(self) -> None:
        """On CUDA the race delay follows an event SGLang recorded on the forward stream (the simulator's
        `record_event` adds it itself): the forward's first work after the publish waits it out."""
        bridge = self.session.bridge
        if bridge is not None and bridge.pending_delay:
            bridge.pending_delay = False
            self.harness_device.delay(self.harness_device.race_delay)

    # -- the backend and the eager runner ----------------------------------------------------------

    def _build_backend(self):
        """The release's backend, built by its own `__init__` over SGLang's pools, with the resolver observed
        (`_observe_resolver`)."""
        backend = self.eager.real.backend
        self._observe_resolver(backend)
        return backend

    def _real_backend(self) -> EagerPath:
        """SGLang's pools and backend over the session's tables (`real_backend.RealDsv4`), with the path that runs
        an eager batch (and its breakable replay) through them."""
        session = self.session
        dims, pool = self.case.dims, session.token_to_kv_pool
        real = RealDsv4(self.api, req_to_token=session.req_to_token_pool.req_to_token,
                        full_to_swa=pool.full_to_swa_index_mapping, full_size=pool.size,
                        swa_size=session.sizes.swa_size, layer_ratios=self.model_layer_ratios(), heads=dims.heads,
                        spec_algorithm=self.spec_algorithm, draft_tokens=self._draft_tokens(),
                        hisparse=self.case.flags.hisparse, draft=self.is_draft_worker,
                        device=str(self.harness_device.torch_device))
        return EagerPath(self, real)

    def _draft_tokens(self) -> Optional[int]:
        """The server's `--speculative-num-draft-tokens`: the most tokens any verify batch of the case gives a request
        (SGLang's verify batches stay within it); None for a case without verify batches (the harness draws a batch's
        mode apart from the case's algorithm, so a verify batch says the server verifies)."""
        verify = [r.extend_len for b in self.case.batches if b.mode is HForwardMode.TARGET_VERIFY for r in b.requests]
        return max(verify, default=None)

    def _note_fallback(self, pool) -> None:
        """`pool.translate_loc_from_full_to_swa` called through; noted where `get_swa_out_cache_loc` calls it: the
        backend's re-translation of its write locations through the live mapping, after the snapshot (metadata
        init's own translation is the snapshot)."""
        translate = pool.translate_loc_from_full_to_swa

        def noted(kv_indices):
            if sys._getframe(1).f_code.co_name == "get_swa_out_cache_loc":
                self.probe.note(SwaLocFallback())
            return translate(kv_indices)

        pool.translate_loc_from_full_to_swa = noted

    def _observe_resolver(self, backend) -> None:
        """The real resolver, called through (as host work on the forward stream for a batch of the real path);
        the probe notes what it decided (for the policy oracle): a snapshot, and whether it built the cache."""
        api = self.api
        resolve_name = api.generation.hook
        real_resolve = getattr(backend, resolve_name)

        def resolve_observed(forward_batch, **kwargs):
            before = getattr(backend.forward_metadata, "sparse_prefill_cache", None)
            if self.real_batch:
                ends = self.eager.resolve(real_resolve, forward_batch, **kwargs)
            else:
                ends = real_resolve(forward_batch, **kwargs)
            after = getattr(backend.forward_metadata, "sparse_prefill_cache", None)
            if after is not None and after is not before:
                self.plans.planned(PlanKind.CHUNK_CACHE, after)
            snapshotted = (ends is api.mods["base_backend"].SharedReadEnds.PRE_REPLAY
                           if api.generation.publishes_from_read_end
                           else getattr(backend.forward_metadata, "prefill_shared_reads_snapshotted", False))
            if snapshotted:
                self.probe.note(Snapshot(num_qo_tokens=kwargs["num_qo_tokens"], sparse=after is not None
                                         and after is not before))
            return ends

        setattr(backend, resolve_name, resolve_observed)

    @contextlib.contextmanager
    def _backend_for_batch(self) -> Iterator[None]:
        """The backend's methods for the batch in flight, on the instance while its host code runs: a batch of
        the real path gets SGLang's metadata init as host work on the forward stream (`EagerPath`); any other
        the harness's metadata init (`_init_forward_metadata`), the breakable-graph refresh (`_prepare_bcg_replay`)
        and the chunk-cache build deferred into a launch (`_deferred_chunk_cache`). SGLang's own methods
        otherwise; a closure launched now runs later and calls them."""
        backend = self.attn_backend
        if self.real_batch:
            replaced = {"init_forward_metadata": self.eager.init_forward_metadata,
                        "prepare_forward_metadata_for_breakable_cuda_graph_replay": self.eager.prepare_bcg_replay}
        else:
            replaced = {"init_forward_metadata": self._init_forward_metadata,
                        "prepare_forward_metadata_for_breakable_cuda_graph_replay": self._prepare_bcg_replay,
                        "_build_sparse_prefill_chunk_cache": self._deferred_chunk_cache}
        backend.__dict__.update(replaced)
        try:
            yield
        finally:
            for name in replaced:
                del backend.__dict__[name]

    def _build_eager_runner(self):
        """SGLang's EagerRunner as `ModelRunner.init_backends` has it, without its warmup (no model)."""
        api, sizes = self.api, self.session.sizes
        runner = object.__new__(api.mods["eager_runner"].EagerRunner)
        runner.model_runner = self
        runner.device, runner.device_module = self.device, self.device_module
        runner.enable_pdmux = False
        max_tokens = sizes.max_reqs * sizes.max_context
        with api.mods["runtime"].get_parallel().override(**one_dp_rank(api)):
            runner._eager_registry = api.mods["buffer_registry"].build_eager_registry(
                device=self.harness_device.torch_device, max_bs=sizes.max_reqs, max_num_token=max_tokens,
                cache_loc_dtype=torch.int64)
        return runner

    # -- batches as SGLang's ForwardBatch --------------------------------------------------------

    def sglang_mode(self, fb: ForwardBatch):
        return self.api.mods["forward"].ForwardMode[_MODE_NAMES.get(fb.forward_mode, fb.forward_mode.name)]

    def sglang_batch(self, fb: ForwardBatch, mode=None):
        """A real ForwardBatch over the harness batch's tensors (what the scheduler hands the runner)."""
        mods = self.api.mods
        prefix_lens = [seq - new for seq, new in zip(fb.seq_lens_cpu, fb.extend_seq_lens_cpu)]
        batch = mods["forward"].ForwardBatch(
            forward_mode=mode if mode is not None else self.sglang_mode(fb), batch_size=fb.batch_size,
            input_ids=fb.input_ids, req_pool_indices=fb.req_pool_indices, seq_lens=fb.seq_lens,
            out_cache_loc=fb.out_cache_loc, seq_lens_sum=sum(fb.seq_lens_cpu),
            seq_lens_cpu=torch.tensor(fb.seq_lens_cpu, dtype=torch.int64), positions=fb.positions,
            extend_seq_lens=fb.extend_seq_lens, extend_seq_lens_cpu=list(fb.extend_seq_lens_cpu),
            extend_prefix_lens=torch.tensor(prefix_lens, dtype=torch.int32, device=fb.seq_lens.device),
            extend_prefix_lens_cpu=prefix_lens, extend_num_tokens=fb.num_tokens,
            extend_start_loc=fb.extend_start_loc, spec_algorithm=self.spec_algorithm,
            capture_hidden_mode=mods["forward"].CaptureHiddenMode.NULL)
        if fb.forward_mode is HForwardMode.TARGET_VERIFY and self.runs_real(fb):
            self._as_verify(batch, fb, prefix_lens)
        # The iteration's KV-slot plan, as `ForwardBatch.init_new` gives every batch (the graph runner's
        # load_batch binds it to its static buffer).
        translator = self.kv_index_translator
        if self.api.binds_kv_plan:
            translator.own_plan(batch).bind(batch, translator)
        return batch

    def _as_verify(self, batch, fb: ForwardBatch, committed: list[int]) -> None:
        """A target-verify batch as SGLang's verify step hands it to the target model (`dspark_verify._run_ragged`):
        `seq_lens` the committed lengths (`committed`, the requests' prefixes: the backend adds the verify lengths,
        `make_forward_metadata_from_raw_verify`), and the verify input carrying the per-request layout."""
        batch.seq_lens = batch.extend_prefix_lens.to(fb.seq_lens.dtype)
        batch.spec_info = self.eager.real.verify_input(
            verify_lens=fb.extend_seq_lens_cpu, committed_lens=torch.tensor(committed, dtype=torch.int64),
            input_ids=fb.input_ids, positions=fb.positions)

    def as_loaded(self, forward_batch) -> ForwardBatch:
        """The harness batch with the per-batch tensors SGLang's runner hands the backend (after its
        `load_batch`: the static buffers), so the harness's metadata gathers read what SGLang would."""
        if self.replay_batch is not None:  # a replay's metadata covers the padded rows
            return self.replay_batch
        return dataclasses.replace(self.live_batch, req_pool_indices=forward_batch.req_pool_indices,
                                   seq_lens=forward_batch.seq_lens, positions=forward_batch.positions,
                                   out_cache_loc=forward_batch.out_cache_loc)

    # -- forward ---------------------------------------------------------------------------------

    def forward(self, fb: ForwardBatch, *, graph: bool) -> torch.Tensor:
        """`ModelRunner._forward_raw`'s part: the forward context, then the graph runner or the eager one."""
        contexts = self.api.mods["forward_context"]
        batch = self.sglang_batch(fb)
        self.live_batch = fb
        try:
            batch_kwargs = {"forward_batch": batch} if self.api.generation.context_takes_batch else {}
            with contexts.forward_context(contexts.ForwardContext(attn_backend=self.attn_backend), **batch_kwargs):
                # Decode and idle batches go to the decode graph runner (not this path's); the prefill one decides
                # the rest itself (it refuses target-verify).
                replay = (graph and fb.forward_mode not in (HForwardMode.DECODE, HForwardMode.IDLE)
                          and self.graph_runner.can_run_graph(batch))
                self.real_batch = self.ran_real = self.replays_real(fb) if replay else self.runs_real(fb)
                with self._backend_for_batch():
                    if replay:
                        return self.graph_runner.execute(batch)
                    return self.eager_runner.execute(batch).hidden_states.transpose(0, 1)
        finally:
            self.live_batch, self.real_batch = None, False

    @property
    def real_case(self) -> bool:
        """Whether the case's batches may run SGLang's metadata init and forward: where the real backend runs,
        without CP or HiSparse (their layouts and per-layer translations are the harness's)."""
        flags = self.case.flags
        return not flags.cp_active and not flags.hisparse

    def runs_real(self, fb: ForwardBatch) -> bool:
        """Whether an eager batch runs SGLang's metadata init and forward (`eager`): an EXTEND batch (a MIXED one
        too, which SGLang's eager runner runs as EXTEND), a DECODE batch (its own decode metadata: the raw metadata
        made whole, the decode compressor plan; FlashMLA's `flash_mla_with_kvcache` stood in) or a TARGET_VERIFY
        batch (SGLang's ragged verify metadata, `_as_verify`) of a case that may (`real_case`)."""
        return self.real_case and fb.forward_mode in _REAL_MODES

    def replays_real(self, fb: ForwardBatch) -> bool:
        """Whether a graph replay runs SGLang's capture, replay prep and forward (`real_graph`): a batch that would
        run for real eagerly, replayed by the breakable graph with DSV4's captured metadata (`bcg`). The
        tc_piecewise replay (`fresh`) still runs the harness's metadata and layers."""
        return self.case.graph_contract == "bcg" and self.runs_real(fb)

    def use_sparse_prefill(self, forward_batch, rows: int) -> bool:
        """Whether the forward of `rows` query rows takes sparse prefill: SGLang's own dispatch where the release
        names it (`_use_sparse_prefill`, 0.5.22 on); before, the forward's inline condition, which is the reference
        model's of the same design."""
        decide = getattr(self.attn_backend, "_use_sparse_prefill", self.harness.attn_backend._use_sparse_prefill)
        return decide(forward_batch, num_qo_tokens=rows)

    def run_model(self, fb: ForwardBatch, view, store_compressed=None) -> torch.Tensor:
        dims = self.case.dims
        out = torch.zeros(len(dims.layer_ratios), fb.num_tokens, dims.heads, dims.head_dim,
                          device=self.harness_device.torch_device)
        self.forward_layers(fb, view, out, store_compressed)
        return out

    # -- the replaced metadata init --------------------------------------------------------------

    def _fresh_metadata(self, fb: ForwardBatch):
        """The real DSV4Metadata around a real DSV4AttnMetadata whose fields the harness's gathers fill."""
        core = self.harness.attn_backend.build_core_metadata(fb)
        mods, tdev = self.api.mods, self.harness_device.torch_device
        ratios = tuple(sorted({r for r in self.case.dims.layer_ratios if r}))
        values = dict(
            page_size=core.page_size, page_table=core.page_table, raw_out_loc=core.raw_out_loc,
            cuda_int32_kwargs={"dtype": torch.int32, "device": tdev}, seq_lens_casual=core.seq_lens_casual,
            positions_casual=core.positions_casual, swa_page_indices=core.swa_page_indices,
            swa_topk_lengths=core.swa_topk_lengths, index_topk=core.index_topk, present_ratios=ratios,
            c4_sparse_topk=core.index_topk,  # 0.5.19 and 0.5.20's name of index_topk
            swa_out_cache_loc=core.swa_out_cache_loc, c4_out_loc=core.c4_out_loc,
            c4_topk_lengths_raw=core.c4_topk_lengths_raw, c4_topk_lengths_clamp1=core.c4_topk_lengths_clamp1,
            c128_out_loc=core.c128_out_loc, c128_page_indices=core.c128_page_indices,
            c128_topk_lengths_clamp1=core.c128_topk_lengths_clamp1)
        cls = mods["backend"].DSV4AttnMetadata
        taken = {f.name for f in dataclasses.fields(cls) if f.init}  # this version's constructor
        real = cls(**{name: value for name, value in values.items() if name in taken})
        if hasattr(real, "set_sparse_topk"):
            real.set_sparse_topk(4, page_indices=core.c4_sparse_page_indices,
                                 topk_lengths=core.c4_sparse_topk_lengths, raw_indices=core.c4_sparse_raw_indices)
        else:  # before 0.5.21 the c4 top-k fields are plain attributes
            real.c4_sparse_page_indices = core.c4_sparse_page_indices
            real.c4_sparse_topk_lengths = core.c4_sparse_topk_lengths
            real.c4_sparse_raw_indices = core.c4_sparse_raw_indices
        for ratio in (0, 1, 2, 4, 128):  # FlashMLA's plans: not made here (no FlashMLA)
            setattr(real, f"c{ratio}_flashmla_metadata", None)
        return mods["backend"].DSV4Metadata(core_attn_metadata=real, indexer_metadata=None)

    def _init_forward_metadata(self, forward_batch) -> None:
        """Replaced: the harness's metadata init (the real one plans FlashMLA and JIT kernels). During a
        graph replay the fresh metadata goes into the bucket's static metadata by SGLang's own `copy_`."""
        fresh = self._fresh_metadata(self.as_loaded(forward_batch))
        static = self.replay_static
        backend = self.attn_backend
        if static is None:
            backend.forward_metadata = fresh
        else:
            with self.harness_device.host_work("DSV4Metadata.copy_", reads=_METADATA_SOURCES,
                                               writes={"meta.static": None}):
                static.copy_(fresh)
            self._note_reuse(static)
            backend.forward_metadata = static
        self.plans.planned(PlanKind.METADATA, backend.forward_metadata)

    def _prepare_bcg_replay(self, capture_metadata, forward_batch, *, static_forward_batch=None) -> None:
        """Replaced: fresh metadata from the padded static batch, into the captured object by SGLang's own
        refresh; `swa_out_cache_loc` is recomputed in-graph by SGLang (a launched copy here)."""
        fresh = self._fresh_metadata(self.replay_batch)
        dev = self.harness_device
        with dev.host_work("DSV4Metadata.refresh_for_breakable_cuda_graph_replay_", reads=_METADATA_SOURCES,
                           writes={"meta.static": None}):
            capture_metadata.refresh_for_breakable_cuda_graph_replay_(fresh)
        dst, src = capture_metadata.core_attn_metadata.swa_out_cache_loc, fresh.core_attn_metadata.swa_out_cache_loc
        dev.launch("metadata.swa_out_cache_loc.copy_", lambda: dst.copy_(src),
                   reads={"meta.fresh": None}, writes={"meta.static": None})
        self._note_reuse(capture_metadata)
        self.attn_backend.forward_metadata = capture_metadata
        self.plans.planned(PlanKind.METADATA, capture_metadata)

    def _note_reuse(self, metadata) -> None:
        self.probe.note(MetadataReuse(cache_reset=metadata.sparse_prefill_cache is None,
                                      flag_reset=not getattr(metadata, "prefill_shared_reads_snapshotted", False)))

    def _deferred_chunk_cache(self, forward_batch, *core_attn_metadata, num_qo_tokens: int):
        """The real `_build_sparse_prefill_chunk_cache`, run inside a launched closure; returns its holder.
        `core_attn_metadata`: the core metadata, which the build takes from 0.5.21 on."""
        api, backend, dev = self.api, self.attn_backend, self.harness_device
        holder = DeferredChunkCache(num_qo_tokens, self._build_label)
        metadata = backend.forward_metadata  # bound at issue time, as a launch binds its pointers
        window = self.case.dims.swa_window
        build = api.backend_cls._build_sparse_prefill_chunk_cache

        def run():
            saved = backend.forward_metadata
            backend.forward_metadata = metadata
            try:
                with swa_window(api, window):
                    holder.value = build(backend, forward_batch, *core_attn_metadata, num_qo_tokens=num_qo_tokens)
            finally:
                backend.forward_metadata = saved

        rows = frozenset((self.replay_batch or self.live_batch).req_pool_indices_cpu)
        dev.launch(self._build_label, run,
                   reads={"req_to_token": rows, "full_to_swa": None, "fb.req_pool_indices": None, "fb.seq_lens": None,
                          "fb.extend_seq_lens": None, "meta.seq_lens_casual": None},
                   writes={"cache.swa_token_ids": None, "cache.c0_combined_indices": None})
        self._build_label = "sparse_prefill_cache.build"
        return holder

    # -- the harness's layers over the real metadata and chunk cache -----------------------------

    def forward_layers(self, fb: ForwardBatch, view, out: torch.Tensor, store_compressed=None) -> None:
        api, backend, harness = self.api, self.attn_backend, self.harness.attn_backend
        harness.forward_metadata = backend.forward_metadata
        rows = fb.num_tokens
        if api.is_cp_active(view):  # CP shards the query layout inside the forward
            harness.late_refresh_swa_rows("cp.shard_metadata", fb, range(rows))
        sparse = self.use_sparse_prefill(view, rows)
        self.probe.note(Forward(rows=rows, sparse=sparse))
        self.plans.read(PlanKind.METADATA, backend.forward_metadata)
        for layer, ratio in enumerate(self.case.dims.layer_ratios):
            self._store_swa(fb, view, layer)
            if store_compressed is not None:
                store_compressed(layer)
            else:
                harness.store_compressed(fb, layer, backend.forward_metadata.core_attn_metadata)
            if ratio == 4:
                harness.run_indexer(fb, layer)
            if sparse:
                self._attend_sparse(fb, view, layer, out)
            else:
                harness.attend_dense(fb, layer, out)

    def _store_swa(self, fb: ForwardBatch, view, layer: int) -> None:
        backend = self.attn_backend
        loc = backend.get_swa_out_cache_loc(view)  # real: the snapshot, or a re-translation through the live map
        cached = loc is backend.forward_metadata.core_attn_metadata.swa_out_cache_loc
        swa_kv = self.session.token_to_kv_pool.swa_kv

        def store():
            swa_kv[layer].index_copy_(0, loc.long(), fb.kv_new[layer])

        self.harness_device.launch(f"layer{layer}.store_swa", store,
                                   reads={"meta.swa_out_cache_loc" if cached else "tmp.swa_loc": None},
                                   writes={f"swa_kv[{layer}]": None})

    def _attend_sparse(self, fb: ForwardBatch, view, layer: int, out: torch.Tensor) -> None:
        """`_forward_prefill_sparse` with FlashMLA replaced: the real cache's combined indices over a workspace
        gathered from the harness's KV (compressed region first, then the SWA region, SGLang's layout)."""
        backend, harness, dims = self.attn_backend, self.harness.attn_backend, self.case.dims
        metadata = backend.forward_metadata
        core = metadata.core_attn_metadata
        rows = fb.num_tokens
        if metadata.sparse_prefill_cache is None:  # what the real layer does: build lazily (a late read)
            self._build_label = f"layer{layer}.sparse_prefill_cache.lazy_build"
            core_arg = (core,) if self.api.generation.build_takes_core else ()
            metadata.sparse_prefill_cache = backend._build_sparse_prefill_chunk_cache(
                view, *core_arg, num_qo_tokens=rows)
            self.probe.note(LazyBuild(layer=layer))
            self.plans.planned(PlanKind.CHUNK_CACHE, metadata.sparse_prefill_cache)
        holder = metadata.sparse_prefill_cache
        self.plans.read(PlanKind.CHUNK_CACHE, holder)
        if holder.num_qo_tokens != rows:
            raise RuntimeError(f"sparse prefill cache built for {holder.num_qo_tokens} query rows, "
                               f"the forward has {rows}")
        pool, ratio, sink = self.session.token_to_kv_pool, dims.layer_ratios[layer], self.session.sink[layer]
        page_table, raw4, c128 = core.page_table, core.c4_sparse_raw_indices, core.c128_page_indices
        core_view = SimpleNamespace(sparse_page_indices=lambda r: c128 if r == 128 else None)  # bound at issue
        ps, scale = dims.page_size, dims.head_dim ** -0.5
        hisparse = self.case.flags.hisparse
        compressed_c128, compressed_c4 = _COMPRESSED_INPUTS[self.api.generation.compressed_api]

        def attend():
            cache = holder.get()
            swa_region = pool.swa_kv[layer][cache.swa_token_ids.long()]
            if ratio == 0:
                kv, idx = swa_region, cache.c0_combined_indices
            else:
                if ratio == 128:
                    flat, idx = compressed_c128(cache, core_view, c128)
                else:  # the harness keys compressed entries by the full slot of a block's first token
                    c_max = max(cache.max_seq_len // ratio, 1)
                    starts = (torch.arange(c_max, device=page_table.device) * ratio)[None, :]
                    block_table = page_slot(page_table, starts.expand(page_table.shape[0], -1), ps)
                    flat, idx = compressed_c4(cache, block_table, raw4[: cache.num_qo_tokens].to(torch.int32))
                slots = harness.compressed_slots(flat.long())[0] if hisparse else flat.long()
                kv = torch.cat([pool.extra_kv[layer][slots.clamp(min=0)], swa_region])
            out[layer].copy_(sparse_attention_on(kv.device)(fb.q[layer], kv, idx.long(), sink, scale))

        reads = {f"swa_kv[{layer}]": None, "cache.swa_token_ids": None, "cache.c0_combined_indices": None}
        if ratio:
            reads[f"extra_kv[{layer}]"] = None
            reads["meta.c4_sparse_raw_indices" if ratio == 4 else "meta.c128_page_indices"] = None
            reads["meta.page_table"] = None
            if hisparse:
                reads["full_to_hisparse"] = None
        self.harness_device.launch(f"layer{layer}.attention.sparse", attend, reads=reads,
                           writes={"out": None, "cache.compressed": None})


class _Unnoted:
    """A draft runner's probe: its dispatch, snapshot, forward and fallback records are dropped. The oracles judge
    the target's publication from them; a draft runner never publishes (`maybe_publish_prefill_shared_read_done`
    refuses every algorithm with a draft extend) and its own decisions would read as a second forward of the batch.
    Its plans are noted (the session's `Plans`: the freshness oracle judges what its forward reads)."""

    @staticmethod
    def note(record) -> None:
        del record


class SglangDraftRunner(SglangModelRunner):
    """EAGLE's draft model runner (`EAGLEWorkerV2.draft_runner`: a `ModelRunner` with `is_draft_worker`) for
    DSV4's NextN model, one SWA-only attention layer (`deepseek_v4_nextn.COMPRESS_RATIO_NEXTN_LAYER`, 0): SGLang's
    own pool and backend, built by their `__init__`s over the session's tables (a draft worker shares the target's
    request pool and KV allocator, so the same `req_to_token` and full->SWA mapping), and SGLang's own eager runner.
    The harness's NextN layer takes the target's first layer's inputs (its q, SWA latent and sink), so the reference
    model's draft extend (`run_speculative_tail`: window attention over the first layer's SWA latents) is what it
    must compute; its SWA history is the first layer's.

    Two batches run it: the draft extend after a prefill (`draft_extend`, eager: SGLang captures a draft's
    breakable graph only for `force_for_draft_worker`, not modelled), and a draft-extend batch (`DRAFT_EXTEND_V2`,
    `draft_extend_v2`) of the server's draft width, through SGLang's draft-extend CUDA graph runner where the batch
    replays (`draft_graph`) and eagerly otherwise."""

    is_draft_worker = True
    canary_manager = None  # what the draft-extend runner's capture asks of its model runner

    def __init__(self, session: SglangSession, target: SglangModelRunner):
        super().__init__(session, probe=_Unnoted(), plans=target.plans)
        self.extend_graph_runner = self._build_extend_graph_runner()

    def model_layer_ratios(self) -> tuple[int, ...]:
        return (0,)

    def _build_graph_runner(self) -> None:
        return None

    def _draft_tokens(self) -> Optional[int]:
        """The server's `--speculative-num-draft-tokens` as the draft backend reads it: the case's draft-extend width
        (`draft_extend_width`) where it has draft-extend batches, else the target's (its verify batches')."""
        width = draft_extend_width(self.case)
        return width if width is not None else super()._draft_tokens()

    def _build_extend_graph_runner(self) -> Optional[SglangDraftExtendGraphRunner]:
        """SGLang's draft-extend graph runner, capturing the batch sizes (of SGLang's speculative capture list) the
        case's replayed draft-extend batches pad to; None when no batch replays one."""
        width = draft_extend_width(self.case)
        sizes = [len(b.requests) for b in self.case.batches if b.graph and runs_sglangs_draft_extend(b.mode, [r.extend_len for r in b.requests], width)]
        if not sizes:
            return None
        capture_list = self.api.mods["buckets"].generate_decode_cuda_graph_batch_sizes(
            SimpleNamespace(disable_cuda_graph_padding=False, speculative_algorithm=self.case.spec.name),
            self.session.sizes.max_reqs)
        pad = self.api.mods["base_graph_runner"].BaseCudaGraphRunner._pad_to_bucket
        return SglangDraftExtendGraphRunner(self, width=width,
                                            batch_sizes=sorted({pad(bs, capture_list) for bs in sizes}))

    def draft_extend(self, fb: ForwardBatch) -> torch.Tensor:
        """`EAGLEWorkerV2._draft_extend_for_prefill`'s forward: the target's prefill batch, as an EXTEND batch of the
        draft runner (SGLang's eager runner, the backend's metadata init, resolver and forward). [rows, heads, 512]."""
        return self.forward(fb, graph=False)[0]

    def draft_extend_v2(self, fb: ForwardBatch, *, graph: bool) -> torch.Tensor:
        """`EAGLEWorkerV2._draft_extend_for_decode`'s forward of a draft-extend batch: the batch as
        `prepare_for_draft_extend` makes it (every request `width` tokens, `seq_lens` past them, the window's write
        locations), then SGLang's draft-extend graph runner where `can_run_graph` lets it, else the backend's metadata
        init (marked ready, as `prepare_for_draft_extend` does) and the draft runner's eager forward. [rows, heads,
        512]."""
        mods = self.api.mods
        batch = self.sglang_batch(fb, mode=mods["forward"].ForwardMode.DRAFT_EXTEND_V2)
        width = draft_extend_width(self.case)
        accepted = torch.full((fb.batch_size,), width, dtype=torch.int32, device=fb.seq_lens.device)
        batch.spec_info = mods["eagle_info"].EagleDraftExtendInput(
            hidden_states=None, num_correct_drafts=accepted - 1, num_accept_tokens=accepted,
            num_tokens_per_req=width, positions=fb.positions)
        self.live_batch = fb
        self.real_batch = self.ran_real = True
        contexts = self.api.mods["forward_context"]
        batch_kwargs = {"forward_batch": batch} if self.api.generation.context_takes_batch else {}
        try:
            with contexts.forward_context(contexts.ForwardContext(attn_backend=self.attn_backend), **batch_kwargs):
                runner = self.extend_graph_runner
                if graph and runner is not None and runner.can_run_graph(batch):
                    return runner.execute(batch)
                self.eager.init_forward_metadata(batch)
                batch.mark_forward_metadata_ready()
                return self.eager_runner.execute(batch).hidden_states[:, 0]
        finally:
            self.live_batch, self.real_batch = None, False


def draft_extend_width(case: Case) -> Optional[int]:
    """The tokens per request of the case's first draft-extend batch whose requests all have the same count (the
    server's `--speculative-num-draft-tokens`: `prepare_for_draft_extend` gives every request that many); None
    without one."""
    for b in case.batches:
        widths = {r.extend_len for r in b.requests}
        if b.mode is HForwardMode.DRAFT_EXTEND and len(widths) == 1:
            return widths.pop()
    return None


def runs_sglangs_draft_extend(mode: HForwardMode, lengths, width: Optional[int]) -> bool:
    """Whether a batch of `mode` whose requests extend by `lengths` is a draft-extend batch SGLang's draft runner
    runs: every request the server's `width` tokens."""
    return mode is HForwardMode.DRAFT_EXTEND and width is not None and bool(lengths) and set(lengths) == {width}


__all__ = ["SglangDraftRunner", "SglangModelRunner", "SglangSession"]
