"""The session of `--target sglang`: the harness's world driven through the real SGLang code of the installed release.

Two paths, chosen per batch (`SglangModelRunner.runs_real`):

- on every release, an eager EXTEND batch (a MIXED one too, which SGLang's eager
  runner runs as EXTEND), DECODE batch or TARGET_VERIFY batch (EAGLE's uniform verify where an EAGLE-family case
  verifies at its draft width, else SGLang's ragged verify: `_as_verify`), and the target's part of a DRAFT_EXTEND
  batch (the harness's draft-extend batch stands for a speculative server's decode step: SGLang's target verifies
  those tokens, then the draft extends over them; its target part is that verify, `target_mode`), on
  either device (with HiSparse, but for a decode batch: over SGLang's HiSparse c4 pool and the session's mapping,
  `_hisparse_tables`), runs SGLang's own `DeepseekV4AttnBackend`, built by its `__init__` over
  SGLang's own `DeepSeekV4TokenToKVPool`: its `init_forward_metadata`, its resolver (the PR-era hook on 0.5.19 to
  0.5.22) and chunk-cache build, and per layer its `forward` (store, sparse or dense attention), with only compiled
  code stood in (`real_backend.py`, `eager.py`; on CUDA SGLang's JIT kernels compile and run, FlashMLA is stood in
  where its wheel does not load).
  Such a batch replayed by the breakable graph (`bcg`) does too (a HiSparse case's included, with the capture's
  HiSparse indexer step kept: `real_graph.RealGraphs.capture_hisparse_indexer`): SGLang's
  `PrefillCudaGraphRunner`, built by its
  own `__init__`, captures the bucket at start-up (`capture_one_shape`, the backend's capture init) and refreshes
  it per replay (the backend's own prep), the captured segments read what the capture bound (`graph_runner.py`,
  `real_graph.py`). Its KV is in SGLang's pool, which `kv_state` decodes;
- with EAGLE's draft model (EAGLE, EAGLE3, NEXTN, STANDALONE), the draft extend after such a prefill batch (EXTEND or
  MIXED: `EAGLEWorkerV2._draft_extend_for_prefill`) runs SGLang's own draft runner (`SglangDraftRunner`): a pool and
  backend built by their `__init__`s as a draft worker's (`is_draft_worker`, DSV4's NextN model, one SWA-only
  layer) over the same tables, SGLang's eager runner, the draft backend's metadata init, resolver and forward; and
  after a verify or draft-extend batch whose requests are all the server's draft width
  (`EAGLEWorkerV2._draft_extend_for_decode`) the draft extend runs it as a `DRAFT_EXTEND_V2` batch, eagerly or
  replayed by SGLang's own `EAGLEDraftExtendCudaGraphRunner` (`draft_graph.py`: its capture, `execute`, publish and
  the recorded in-graph metadata step);
- a CP case (0.5.23; the PR-era releases shard a CP batch across processes and are refused one) runs the same eager
  paths, the draft's included; an EXTEND or MIXED batch that CP shards (SGLang's own `InterleaveCPStrategy.can_apply`:
  at least as many tokens as ranks; a smaller one runs whole, `Flags.cp_shards`) as SGLang's plan and forward of
  every CP rank (`eager.EagerPath._init_every_rank`, `_cp_forward`): the process stands in for its peer ranks,
  planning and running their rows at the same point with the same backend, so each token row comes from the plan of
  the rank that owns it (`apply_cp_reindex`), and the harness holds the all-gathers (one process holds every rank's
  rows); a verify, which CP does not shard, as the static verify a CP server runs (SGLang refuses the ragged one
  under CP: `SGLANG_RAGGED_VERIFY_MODE=static`, every request at the server's width; a CP case whose verify widths
  differ, which no CP server runs, is refused);
- a CP case replays no prefill graph: SGLang's server resolution turns DSV4's prefill graph off under CP (DSV4's
  interleave CP has no breakable graph of its own in any release, `policy.runs_graph`), so its graph batches run
  eagerly, as above, and the target builds no prefill graph runner for it;
- a HiSparse case's decode batches run the harness's metadata and layers over the
  same backend object, as listed under "Replaced" below; so does the draft extend
  after a decode batch and after a verify or draft-extend batch of uneven widths (`run_speculative_tail`, over the
  SWA latents SGLang's forward stored where it ran), which a campaign no longer draws for an EAGLE-family case
  (`SglangTarget.uniform_draft_width`): only a hand-written case has them.

A DSV4 server of any release replays its prefill graph as the breakable graph over DSV4's captured metadata only:
0.5.22 removed the tc_piecewise prefill backend, and to 0.5.21 SGLang's own server resolution turns it off for
DSV4's architecture (`piecewise_cuda_graph_disabled_model_archs`). The target says so (`Target.graph_contracts`),
so a campaign replays every drawn case under `bcg`, and a `fresh` replay is refused.

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
  the publish, `_execute_body_capture` and `_finalize_execute_output` (the trim to the live rows); the graph
  backend `BreakableCudaGraphBackend` but for its `replay`; `models/deepseek_v4.py`: the attention op the model
  calls inside the breakable graph (`bcg_deepseek_v4_attention_with_output`: the bucket's rows sliced to the
  live ones before the backend's `forward`, `eager.EagerPath._graph_op`); `mem_cache/kv_index_translator.py`:
  `KVIndexTranslator.own_plan` and the plan's `bind` /
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
  `replay` runs SGLang's forward with the captured segments of `real_graph.py` over SGLang's static batch; its
  `capture_one` keeps what a graph holds. The runner is built by SGLang's `__init__` and captures at start-up the
  buckets the case pads to, with the CUDA-graph machinery stood in (`graph_runner.py` lists each piece);
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

import dataclasses
from types import SimpleNamespace
from typing import Optional

import torch

from harness.case import Case
from harness.device import DeviceKind
from harness.errors import InvalidArgument
from harness.model.enums import ForwardMode as HForwardMode
from harness.model.pools import ForwardBatch
from harness.probe import Dispatch, Publish
from harness.sglang_target import server
from harness.sglang_target.draft_runner import SglangDraftRunner
from harness.sglang_target.model_runner import DeferredChunkCache, SglangModelRunner
from harness.sglang_target.real_backend import PAGE_SIZE, fixed_dims
from harness.sglang_target.platform import CudaEventBridge, SimStream, sglang_config
from harness.sglang_target.scheduler import SchedulerShell, ShellBatch
from harness.targets import Classes, ReferenceSession

# The modes of a prefill batch, after whose target forward EAGLE's worker runs the draft extend
# (`EAGLEWorkerV2.forward_batch_generation`: `batch.forward_mode.is_extend()`).
_PREFILL_MODES = (HForwardMode.EXTEND, HForwardMode.MIXED)


class _Worker:
    """A model worker whose `last_shared_read_runner` is the real property of `cls`."""

    def __init__(self, cls, **attrs):
        self._prop = cls.__dict__["last_shared_read_runner"]
        self.__dict__.update(attrs)

    @property
    def last_shared_read_runner(self):
        return self._prop.fget(self)


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
        widths = sorted({r.extend_len for b in case.batches if b.mode.is_draft_wide() for r in b.requests})
        if case.flags.cp_active and len(widths) > 1:
            raise InvalidArgument(f"case batches[].requests[].extend_len of the TARGET_VERIFY and DRAFT_EXTEND batches "
                                  f"of a CP case (flags.cp_active=true): {widths}; allowed: one width for the case (a "
                                  "CP server verifies every request at its draft width: SGLang refuses the ragged "
                                  "verify under CP, 'set SGLANG_RAGGED_VERIFY_MODE off for CP runs')")
        if case.graph_contract not in api.graph_contracts and any(b.graph for b in case.batches):
            raise InvalidArgument(f"case graph_contract={case.graph_contract!r}: allowed: "
                                  f"{', '.join(api.graph_contracts)} (sglang {api.version} replays DSV4's prefill graph "
                                  "as the breakable graph over its captured metadata: tc_piecewise, whose replay plans "
                                  "fresh metadata, was removed in 0.5.22 and is turned off for DSV4 before)")
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
        self.hisparse_slots, self.hisparse_map = self._hisparse_tables() if case.flags.hisparse else (None, None)
        self.model_runner = SglangModelRunner(self)
        # EAGLE's draft extend after a prefill, through SGLang's draft runner, in a case whose prefills run SGLang's
        # own backend (`real_case`); otherwise, and after any other batch, the harness's (`run_speculative_tail`).
        self.draft_runner = (SglangDraftRunner(self, self.model_runner)
                             if case.spec.is_eagle_family() and self.model_runner.real_case else None)
        self.scheduler = self._scheduler_shell(api, device)

    def _hisparse_tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A HiSparse server's c4 allocation and its mapping. SGLang's HiSparse allocator hands out each logical c4
        slot a device slot from a free list of its own (`DeepSeekV4HiSparseTokenToKVPoolAllocator.alloc_extend`), so
        the two orders part as soon as any request has freed pages; here the device pages come in the reverse
        order of the logical ones (page 0, the padding page, kept in place): a state a server reaches, and one
        in which a read of a logical slot where a device slot is meant reads another block. Returns the device
        slot of each logical c4 slot (int64 [full // 4]) and the session's `full_to_hisparse`: indexed by full slot,
        the device slot of the c4 block whose first token it is, so that its every fourth entry, with the -1 after
        the last that an invalid index (-1) reads, is SGLang's mapping by logical c4 slot
        (`full_to_hisparse_device_index_mapping`), which SGLang's pool reads (`RealDsv4`)."""
        full, tdev = self.token_to_kv_pool.size, self.device.torch_device
        per_page = PAGE_SIZE // 4
        logical = torch.arange(full // 4, dtype=torch.int64, device=tdev)
        page = logical // per_page
        slots = torch.where(page == 0, 0, full // PAGE_SIZE - page) * per_page + logical % per_page
        table = torch.zeros(full + 4, dtype=torch.int64, device=tdev)
        table[full] = -1
        return slots, table

    @property
    def full_to_hisparse(self) -> torch.Tensor:
        """With HiSparse, SGLang's mapping by full slot (`_hisparse_tables`); else the harness's."""
        return super().full_to_hisparse if self.hisparse_map is None else self.hisparse_map

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
        if self.hisparse_map is not None:  # the allocation, whatever the last step evicted
            self.hisparse_map[: self.token_to_kv_pool.size: 4] = self.hisparse_slots
        for runner in self._sglang_runners():
            runner.eager.load(world)
        return dataclasses.replace(fb, seq_lens=fb.seq_lens.to(torch.int64),
                                   req_pool_indices=fb.req_pool_indices.to(torch.int64))

    def kv_state(self) -> dict[str, torch.Tensor]:
        """The KV the last forward wrote: SGLang's pool, decoded, after a batch of the real path; the harness's
        pools after any other (the harness's layers ran it: a HiSparse case's decode, a CP case's ragged verify)."""
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
            if self.draft_runner is not None and self.draft_runner.extends_over(fb):
                outputs["draft_extend"] = self.draft_runner.draft_extend_v2(fb, graph=graph)
                return outputs
            tail_metadata = self._tail_metadata(fb, mr.attn_backend.forward_metadata)
            self.harness_runner.attn_backend.forward_metadata = tail_metadata
            if mr.ran_real and self.case.spec.is_eagle_family():
                self._swa_kv_for_tail()
            outputs.update(self.harness_runner.run_speculative_tail(fb))
        return outputs

    def _swa_kv_for_tail(self) -> None:
        """The harness's draft extend (after a decode batch, or a verify of uneven widths) reads the harness's pool:
        where SGLang's forward wrote this batch's KV into SGLang's pool, the SWA latents are copied from there first
        (decoded), so the draft attends over what the target's forward stored, as the reference's does (the harness's
        pool holds only the history the batch was loaded with)."""
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


__all__ = ["SglangSession"]
