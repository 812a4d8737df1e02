"""The model runner of `--target sglang`: what SGLang's `ModelRunner` is to the real code (the device, the spec
algorithm, the backend built by its `__init__` over SGLang's pool, the model, the event mailbox, the eager and prefill
graph runners), and the model above the backend (`HarnessModel`: the harness's layers). `session.py` says which
batches run which path and lists the real code and the stand-ins."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from types import MethodType, SimpleNamespace
from typing import Any, Optional

import torch

from harness.device import DeviceKind
from harness.model.attention import sparse_attention_on
from harness.model.backend import page_slot
from harness.model.enums import ForwardMode as HForwardMode
from harness.model.pools import ForwardBatch
from harness.probe import Forward, LazyBuild, PlanKind, Snapshot, SwaLocFallback
from harness.sglang_target import server
from harness.sglang_target.eager import EagerPath
from harness.sglang_target.graph_runner import SglangPrefillGraphRunner
from harness.sglang_target.plans import Plans
from harness.sglang_target.real_backend import RealDsv4
from harness.sglang_target.platform import SimDeviceModule, one_dp_rank, register_sim_device, swa_window
from harness.targets import ReferenceSession  # the owning SglangSession's base (session.py imports this)

_MODE_NAMES = {HForwardMode.DRAFT_EXTEND: "DRAFT_EXTEND_V2"}
# A ForwardBatch's live token count, by release (0.5.20 on `global_`; 0.5.19 not), which `init_new` sets.
_NON_PADDED_FIELDS = ("global_num_token_non_padded_cpu", "num_token_non_padded_cpu")
# The modes whose eager batches run SGLang's metadata init and forward (`SglangModelRunner.runs_real`).
_REAL_MODES = (HForwardMode.EXTEND, HForwardMode.MIXED, HForwardMode.DECODE, HForwardMode.TARGET_VERIFY,
               HForwardMode.DRAFT_EXTEND)
# The mode the target model runs a batch in where it is not the batch's own: the harness's draft-extend batch stands
# for a speculative server's decode step, whose target part is the verify of those tokens (`EAGLEWorkerV2.verify`,
# then `_draft_extend_for_decode` on the draft model); SGLang's target never runs a draft-extend batch.
_TARGET_MODES = {HForwardMode.DRAFT_EXTEND: HForwardMode.TARGET_VERIFY}
_VERIFYING_MODES = (HForwardMode.TARGET_VERIFY, *_TARGET_MODES)  # the batches the target verifies


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


class SglangModelRunner:
    """What SGLang's ModelRunner is to the real code: the device, the spec algorithm, the backend, the
    model, the event mailbox and the runners."""

    is_draft_worker = False

    def __init__(self, session: ReferenceSession, *, probe=None, plans: Optional[Plans] = None):
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
        self.mha_companion_layers, self.moe_layers, self.moe_fusions = [], [], []
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
        # The model's attention layers, by layer id, as `ModelRunner` collects them: the prefill graph runner's
        # context holds them, and the model's graph attention op hands the backend's `forward` its layer from it.
        self.attention_layers = list(self.eager.real.layers)
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
        """SGLang's prefill graph runner, built and captured at start-up; none where the server has no prefill graph
        (`Flags.has_prefill_graph`: a CP case), which then runs every batch eagerly."""
        return SglangPrefillGraphRunner(self) if self.case.flags.has_prefill_graph else None

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
        mapping = session.hisparse_map  # by full slot: every fourth entry is SGLang's, by c4 slot
        real = RealDsv4(self.api, req_to_token=session.req_to_token_pool.req_to_token,
                        full_to_swa=pool.full_to_swa_index_mapping, full_size=pool.size,
                        swa_size=session.sizes.swa_size, layer_ratios=self.model_layer_ratios(), heads=dims.heads,
                        spec_algorithm=self.spec_algorithm, draft_tokens=self._draft_tokens(),
                        hisparse_map=None if self.is_draft_worker or mapping is None else mapping[::4],
                        draft=self.is_draft_worker,
                        device=str(self.harness_device.torch_device))
        return EagerPath(self, real)

    def _draft_tokens(self) -> Optional[int]:
        """The server's `--speculative-num-draft-tokens`: the most tokens any verify batch of the case gives a request,
        a draft-extend batch's target part (a verify, `target_mode`) counted (SGLang's verify batches stay within it);
        None for a case without either (the harness draws a batch's mode apart from the case's algorithm, so a verify
        batch says the server verifies)."""
        verify = [r.extend_len for b in self.case.batches if b.mode in _VERIFYING_MODES for r in b.requests]
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
        the harness's metadata init (`_init_forward_metadata`) and the chunk-cache build deferred into a launch
        (`_deferred_chunk_cache`). SGLang's own methods
        otherwise; a closure launched now runs later and calls them."""
        backend = self.attn_backend
        if self.real_batch:
            replaced = {"init_forward_metadata": self.eager.init_forward_metadata,
                        "prepare_forward_metadata_for_breakable_cuda_graph_replay": self.eager.prepare_bcg_replay}
        else:
            replaced = {"init_forward_metadata": self._init_forward_metadata,
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
        return self.sglang_mode_of(fb.forward_mode)

    def sglang_mode_of(self, mode: HForwardMode):
        """SGLang's mode of the batches this target runs for the harness's `mode` (a draft extend is EAGLE's
        `DRAFT_EXTEND_V2`); None where the installed release has no such mode."""
        return getattr(self.api.mods["forward"].ForwardMode, _MODE_NAMES.get(mode, mode.name), None)

    def target_mode(self, fb: ForwardBatch):
        """The mode the target model runs `fb` in: a draft-extend batch of the real path as SGLang's verify of its
        tokens (`_TARGET_MODES`), any other batch in its own mode."""
        if self.runs_real(fb) and fb.forward_mode in _TARGET_MODES:
            return self.api.mods["forward"].ForwardMode[_TARGET_MODES[fb.forward_mode].name]
        return self.sglang_mode(fb)

    def sglang_batch(self, fb: ForwardBatch, mode=None):
        """A real ForwardBatch over the harness batch's tensors (what the scheduler hands the runner)."""
        mods = self.api.mods
        prefix_lens = [seq - new for seq, new in zip(fb.seq_lens_cpu, fb.extend_seq_lens_cpu)]
        mode = mode if mode is not None else self.sglang_mode(fb)
        batch = mods["forward"].ForwardBatch(
            forward_mode=mode, batch_size=fb.batch_size,
            input_ids=fb.input_ids, req_pool_indices=fb.req_pool_indices, seq_lens=fb.seq_lens,
            out_cache_loc=fb.out_cache_loc, seq_lens_sum=sum(fb.seq_lens_cpu),
            seq_lens_cpu=torch.tensor(fb.seq_lens_cpu, dtype=torch.int64), positions=fb.positions,
            extend_seq_lens=fb.extend_seq_lens, extend_seq_lens_cpu=list(fb.extend_seq_lens_cpu),
            extend_prefix_lens=torch.tensor(prefix_lens, dtype=torch.int32, device=fb.seq_lens.device),
            extend_prefix_lens_cpu=prefix_lens, extend_num_tokens=fb.num_tokens,
            extend_start_loc=fb.extend_start_loc, spec_algorithm=self.spec_algorithm,
            capture_hidden_mode=mods["forward"].CaptureHiddenMode.NULL)
        # The batch's live token count, as `ForwardBatch.init_new` sets it: what a padded static batch carries and
        # the model's graph attention op slices a layer's rows to.
        for name in _NON_PADDED_FIELDS:
            if hasattr(batch, name):
                setattr(batch, name, fb.num_tokens)
        if mode == mods["forward"].ForwardMode.TARGET_VERIFY and self.runs_real(fb):
            self._as_verify(batch, fb, prefix_lens)
        # The iteration's KV-slot plan, as `ForwardBatch.init_new` gives every batch (the graph runner's
        # load_batch binds it to its static buffer).
        translator = self.kv_index_translator
        if self.api.binds_kv_plan:
            translator.own_plan(batch).bind(batch, translator)
        return batch

    def _as_verify(self, batch, fb: ForwardBatch, committed: list[int]) -> None:
        """A target-verify batch as SGLang's verify step hands it to the target model: `seq_lens` the committed
        lengths (`committed`, the requests' prefixes: the backend adds the verify lengths,
        `make_forward_metadata_from_raw_verify`), and the verify input: EAGLE's (`EAGLEWorkerV2.verify`, the uniform
        verify) where an EAGLE-family server verifies every request at its draft width; a CP server's DSpark verify
        at that width (`dspark_verify.run_non_compact`, SGLang's static verify, the only one it runs under CP); else
        DSpark's, carrying the per-request layout (`dspark_verify._run_ragged`, SGLang's only form for unequal
        lengths)."""
        batch.seq_lens = batch.extend_prefix_lens.to(fb.seq_lens.dtype)
        committed_lens = torch.tensor(committed, dtype=torch.int64)
        width = self._draft_tokens()
        uniform = dict(committed_lens=committed_lens, input_ids=fb.input_ids, positions=fb.positions)
        if self.case.spec.is_eagle_family() and self.verifies_static(fb):
            batch.spec_info = self.eager.real.eagle_verify_input(width=width, **uniform)
            return
        if self.case.flags.cp_active:
            batch.spec_info = self.eager.real.static_verify_input(width=width, **uniform)
            return
        batch.spec_info = self.eager.real.verify_input(
            verify_lens=fb.extend_seq_lens_cpu, committed_lens=committed_lens, input_ids=fb.input_ids,
            positions=fb.positions)

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
        batch = self.sglang_batch(fb, mode=self.target_mode(fb))
        self.live_batch = fb
        try:
            batch_kwargs = {"forward_batch": batch} if self.api.generation.context_takes_batch else {}
            with contexts.forward_context(contexts.ForwardContext(attn_backend=self.attn_backend), **batch_kwargs):
                # Decode and idle batches go to the decode graph runner (not this path's); the prefill one decides
                # the rest itself (it refuses target-verify). A CP server has none (`_build_graph_runner`).
                replay = (graph and self.graph_runner is not None
                          and fb.forward_mode not in (HForwardMode.DECODE, HForwardMode.IDLE)
                          and self.graph_runner.can_run_graph(batch))
                self.real_batch = self.ran_real = self.runs_real(fb)
                with self._backend_for_batch():
                    if replay:
                        return self.graph_runner.execute(batch)
                    return self.eager_runner.execute(batch).hidden_states.transpose(0, 1)
        finally:
            self.live_batch, self.real_batch = None, False

    @property
    def real_case(self) -> bool:
        """Whether every batch of the case that may run SGLang's metadata init and forward does, EAGLE's draft model
        included (`session.SglangSession.draft_runner`): without HiSparse (its decode swaps pages in through the
        HiSparse coordinator, whose host pool the harness does not run). A CP case's draft extend after a prefill
        runs every CP rank's plan and forward of the draft model, as the target's prefill does."""
        return not self.case.flags.hisparse

    def runs_real(self, fb: ForwardBatch) -> bool:
        """Whether an eager batch runs SGLang's metadata init and forward (`eager`): an EXTEND batch (a MIXED one
        too, which SGLang's eager runner runs as EXTEND), a DECODE batch (its own decode metadata: the raw metadata
        made whole, the decode compressor plan; FlashMLA's `flash_mla_with_kvcache` stood in), a TARGET_VERIFY
        batch (SGLang's verify metadata, `_as_verify`) or the target part of a DRAFT_EXTEND batch (that verify,
        `target_mode`); of a CP case (0.5.23) such a batch too, an EXTEND or MIXED one as every CP rank's plan and
        forward (`eager.EagerPath._init_every_rank`), a verify at the server's one width (a CP case of another is
        refused, `SglangSession`);
        with HiSparse, every such batch but a decode (`real_case`), over SGLang's HiSparse c4 pool (the session's
        `hisparse_map`)."""
        if self.case.flags.hisparse and fb.forward_mode is HForwardMode.DECODE:
            return False
        return fb.forward_mode in _REAL_MODES

    def verifies_static(self, fb: ForwardBatch) -> bool:
        """Whether a verify batch is the uniform verify, every request at the server's draft width: an EAGLE-family
        server's only verify (a hand-written EAGLE case of unequal widths runs DSpark's ragged verify). A CP case's
        verify always is (`SglangSession` refuses one of unequal widths)."""
        return set(fb.extend_seq_lens_cpu) == {self._draft_tokens()}

    def use_sparse_prefill(self, forward_batch, rows: int) -> bool:
        """Whether the forward of `rows` query rows takes sparse prefill: SGLang's own dispatch where the release
        names it (`_use_sparse_prefill`, 0.5.22 on); before, the forward's inline condition, which is the reference
        model's of the same design."""
        decide = getattr(self.attn_backend, "_use_sparse_prefill", self.harness.attn_backend._use_sparse_prefill)
        return decide(forward_batch, num_qo_tokens=rows)

    def run_model(self, fb: ForwardBatch, view) -> torch.Tensor:
        dims = self.case.dims
        out = torch.zeros(len(dims.layer_ratios), fb.num_tokens, dims.heads, dims.head_dim,
                          device=self.harness_device.torch_device)
        self.forward_layers(fb, view, out)
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
        """Replaced: the harness's metadata init of an eager batch off the real path (`runs_real`)."""
        backend = self.attn_backend
        backend.forward_metadata = self._fresh_metadata(self.as_loaded(forward_batch))
        self.plans.planned(PlanKind.METADATA, backend.forward_metadata)

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

    def forward_layers(self, fb: ForwardBatch, view, out: torch.Tensor) -> None:
        backend, harness = self.attn_backend, self.harness.attn_backend
        harness.forward_metadata = backend.forward_metadata
        rows = fb.num_tokens  # no batch CP shards comes here: it runs every rank's plan and forward (`eager`)
        sparse = self.use_sparse_prefill(view, rows)
        self.probe.note(Forward(rows=rows, sparse=sparse))
        self.plans.read(PlanKind.METADATA, backend.forward_metadata)
        for layer, ratio in enumerate(self.case.dims.layer_ratios):
            self._store_swa(fb, view, layer)
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


__all__ = ["DeferredChunkCache", "HarnessLayers", "HarnessModel", "SglangModelRunner"]
