"""The session of `--target sglang`: the harness's world driven through the real SGLang 0.5.23 code.

Real SGLang code (called, not copied):

- `DeepseekV4AttnBackend.resolve_prefill_shared_read_ends` (the base resolver), `_snapshot_prefill_shared_reads`,
  `_use_sparse_prefill`, `shared_read_ends`, `_build_sparse_prefill_chunk_cache` (which calls
  `SparsePrefillChunkCache.build`, i.e. the Triton kernels `build_swa_token_ids` and `combine_topk_swa_indices`,
  interpreted on the CPU simulator, compiled on CUDA), `get_swa_out_cache_loc`, and per sparse layer `SparsePrefillChunkCache.ensure_c128`,
  `ensure_compressed` and `combine_compressed`;
- `DSV4Metadata` itself, with its `copy_` and `refresh_for_breakable_cuda_graph_replay_` (the cache reset);
- `maybe_publish_prefill_shared_read_done`, `SpeculativeAlgorithm` (`from_string`, `is_dflash_family`,
  `supports_prefill_shared_read_done`), the env flags through `sglang.srt.environ.envs`, the memory config bag
  (`get_memory()`), `is_cp_active`/`get_cp_strategy`;
- `PrefillCudaGraphRunner._prepare_forward_metadata_for_replay` (on a stub runner), `ShapeKey`,
  `generate_prefill_cuda_graph_batch_sizes`, `BaseCudaGraphRunner._pad_to_bucket`,
  `_MAX_PREFILL_CUDA_GRAPH_PADDING_FACTOR`;
- `Scheduler._apply_war_barrier` (on a stub scheduler) and the workers' `last_shared_read_runner` properties.

Replaced (cannot run on a CPU, or need a full model runner): metadata init (`init_forward_metadata` builds the
harness's core metadata), the attention kernel (`flash_mla_sparse_fwd` -> `harness.model.attention.sparse_attention`
fed with the real combined indices and SWA token ids), the KV stores, the indexer, the captured graphs (emulated
as in the reference), CUDA events (a device-module shim over the harness device), and the eager runner's call
sequence (replicated from `EagerRunner.execute` / `_execute_extend`, including its MIXED -> EXTEND rewrite).

Every tensor operation is issued through `device.launch` with its reads and writes declared; real SGLang code
that computes on tensors runs inside the launched closure (holders carry its results).

On CUDA the kernels run compiled, on the harness's streams (each launch is issued under the stream's torch
context, which Triton launches on). On the CPU simulator they run interpreted (`_api.py`): TRITON_INTERPRET=1,
the interpreter's int overflow sanitizer off (compiled kernels skip it too), and above 1024 rows the combine
kernel launched with 128 tokens per program instead of 2. One process holds one of the two.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Optional

import torch

from harness.case import Case
from harness.errors import InvalidArgument
from harness.model.attention import sparse_attention_on
from harness.model.backend import page_slot
from harness.model.enums import ForwardMode as HForwardMode
from harness.model.metadata import DSV4AttnMetadata
from harness.model.pools import ForwardBatch
from harness.model.runners import pad_forward_batch
from harness.model.scheduler import Scheduler
from harness.target import Classes, ReferenceSession

GRAPH_MAX_BS = 2048  # the reference's and the policy's max prefill graph bucket

# What the object-built DeepseekV4AttnBackend needs, because its __init__ (which wants a model runner with
# a 512-wide head, page size 256, get_exec() config and CUDA) is skipped. This is the interface contract.
BACKEND_ATTRIBUTES = (
    "model_runner (.spec_algorithm: real SpeculativeAlgorithm, .shared_read_done_event, .attn_backend)",
    "device",
    "req_to_token_pool",
    "req_to_token (req_to_token_pool.req_to_token)",
    "token_to_kv_pool (.full_to_swa_index_mapping, .request_window=None, .get_swa_key_page_size(), "
    ".translate_loc_from_full_to_swa(loc))",
    "hisparse_coordinator (None, or a stand-in object under HiSparse)",
    "forward_metadata (a real DSV4Metadata around the core metadata)",
    "sparse_prefill_kv_buffer (a real SparsePrefillKVBuffer; the build calls forget_head())",
)
# Instance attributes that shadow methods of the class: the parts replaced on a CPU.
BACKEND_HOOKS = (
    "init_forward_metadata (harness core metadata)",
    "prepare_forward_metadata_for_breakable_cuda_graph_replay (harness refresh_, then the real DSV4Metadata.refresh_)",
    "_build_sparse_prefill_chunk_cache (defers the real method into a launched closure)",
)
# What the real methods read of the core metadata and of the forward batch.
CORE_METADATA_FIELDS = ("seq_lens_casual", "swa_out_cache_loc", "request_window_layout (None)", "page_table",
                        "sparse_page_indices(128)", "sparse_raw_indices(4)")
FORWARD_BATCH_FIELDS = ("forward_mode (real ForwardMode)", "batch_size", "input_ids", "req_pool_indices", "seq_lens",
                        "seq_lens_cpu (a CPU tensor: .tolist())", "extend_seq_lens", "extend_seq_lens_cpu",
                        "positions", "out_cache_loc", "global_num_token_non_padded_cpu")

_MODE_NAMES = {HForwardMode.DRAFT_EXTEND: "DRAFT_EXTEND_V2"}


# -- the core metadata the real methods read ---------------------------------------------------------------

@dataclass
class CoreMetadata(DSV4AttnMetadata):
    """The harness's core metadata with the names real SGLang code reads; copies are launched device work."""

    request_window_layout: Any = None
    device: Any = dataclasses.field(default=None, repr=False, compare=False)

    def _launcher(self, op: str):
        return lambda fn: self.device.launch(op, fn, reads={"meta.fresh": None}, writes={"meta.static": None})

    def copy_(self, other: "CoreMetadata", launch=None) -> None:  # called by the real DSV4Metadata.copy_
        super().copy_(other, launch or self._launcher("metadata.copy_"))

    def refresh_for_breakable_cuda_graph_replay_(self, other: "CoreMetadata", launch=None) -> None:
        super().refresh_for_breakable_cuda_graph_replay_(other, launch or self._launcher("metadata.refresh_"))

    def sparse_page_indices(self, ratio: int):
        return {128: self.c128_page_indices, 4: self.c4_sparse_page_indices}.get(ratio)

    def sparse_raw_indices(self, ratio: int):
        return self.c4_sparse_raw_indices if ratio == 4 else None

    @classmethod
    def wrap(cls, core: DSV4AttnMetadata, device) -> "CoreMetadata":
        values = {f.name: getattr(core, f.name) for f in dataclasses.fields(DSV4AttnMetadata)}
        return cls(**values, device=device)


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


@dataclass
class BatchView:
    """The ForwardBatch fields the real SGLang methods read, sharing the harness batch's tensors."""

    forward_mode: Any
    batch_size: int
    input_ids: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    extend_seq_lens: torch.Tensor
    extend_seq_lens_cpu: list
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    harness: ForwardBatch = dataclasses.field(repr=False)
    global_num_token_non_padded_cpu: Optional[int] = None
    graph_static: Any = dataclasses.field(default=None, repr=False)  # the bucket's metadata on a replay


# -- shims: the harness device as SGLang's device module, streams and pool ----------------------------------

class _EventShim:
    """`device_module.Event()`: `record()` records on the harness device's current stream."""

    def __init__(self, device, probe):
        self.device, self.probe, self.event = device, probe, None

    def record(self, stream=None):
        self.event = self.device.record_event()
        self.probe.note("publish", stream=self.device.current_stream.name, event=self.event.id)


class DeviceModuleShim:
    def __init__(self, device, probe):
        self.device, self.probe = device, probe

    def Event(self, *args, **kwargs):  # noqa: N802 - torch.cuda.Event's name
        return _EventShim(self.device, self.probe)


class _StreamShim:
    """What `Scheduler._apply_war_barrier` calls on `schedule_stream`."""

    def __init__(self, device, stream):
        self.device, self.stream = device, stream

    def wait_event(self, event: _EventShim) -> None:
        self.device.wait_event(self.stream, event.event)

    def wait_stream(self, other: "_StreamShim") -> None:
        self.device.wait_stream(self.stream, other.stream)


class PoolShim:
    """`token_to_kv_pool` as the real backend reads it, over the harness's pool."""

    request_window = None

    def __init__(self, pool, device, probe):
        self.pool, self.device, self.probe = pool, device, probe

    @property
    def full_to_swa_index_mapping(self) -> torch.Tensor:
        return self.pool.full_to_swa_index_mapping

    def get_swa_key_page_size(self) -> int:
        return self.pool.page_size

    def translate_loc_from_full_to_swa(self, loc: torch.Tensor) -> torch.Tensor:
        """A read of the live mapping, launched; int32 so that the caller's `.to(torch.int32)` keeps this tensor."""
        f2s = self.pool.full_to_swa_index_mapping
        fresh = torch.empty(loc.shape, dtype=torch.int32, device=loc.device)
        self.probe.note("swa_loc_fallback")
        self.device.launch("get_swa_out_cache_loc.retranslate", lambda: fresh.copy_(f2s[loc]),
                           reads={"full_to_swa": None, "fb.out_cache_loc": None}, writes={"tmp.swa_loc": None})
        return fresh


class _ActiveCP:
    """A CP strategy that applies to every CP-capable batch: the harness's `cp_active` flag."""

    kind = "harness-cp-active"
    cp_size = 2

    def can_apply(self, num_tokens, forward_batch) -> bool:
        return forward_batch.forward_mode.is_context_parallel_extend()


class _Worker:
    """A model worker whose `last_shared_read_runner` is the real property of `cls`."""

    def __init__(self, cls, **attrs):
        self._prop = cls.__dict__["last_shared_read_runner"]
        self.__dict__.update(attrs)

    @property
    def last_shared_read_runner(self):
        return self._prop.fget(self)


# -- the case's SGLang configuration: env flags, memory bag, CP, the window constant --------------------------

def _scoped_env(field, value):
    """`field.override(value)`, or unset (the real default applies) when value is None."""
    if value is not None:
        return field.override(value)

    @contextlib.contextmanager
    def unset():
        saved = os.environ.pop(field.name, None)
        try:
            yield
        finally:
            if saved is not None:
                os.environ[field.name] = saved
    return unset()


def _ensure_memory_bag(api) -> None:
    ctx = api.mods["runtime"].get_context()
    if ctx.is_config_namespace_published("memory"):
        return
    bag = api.mods["runtime"]._ConfigBag("memory")
    for name, value in (("enable_hierarchical_cache", False), ("hicache_storage_backend", None),
                        ("enable_lmcache", False)):
        bag._set(name, value)
    ctx._config_bags = {**(ctx._config_bags or {}), "memory": bag}


@contextlib.contextmanager
def sglang_config(api, case: Case):
    """The case's switches, set through SGLang's own configuration objects, for the host-side calls."""
    flags, envs = case.flags, api.mods["environ"].envs
    _ensure_memory_bag(api)
    cp_base = api.mods["cp_base"]
    saved_cp = cp_base._STRATEGY
    with contextlib.ExitStack() as stack:
        stack.enter_context(_scoped_env(envs.SGLANG_ENABLE_PREFILL_WAR_READ_DONE, flags.SGLANG_ENABLE_PREFILL_WAR_READ_DONE))
        stack.enter_context(envs.SGLANG_FORCE_COARSE_WAR_BARRIER.override(flags.SGLANG_FORCE_COARSE_WAR_BARRIER))
        stack.enter_context(envs.SGLANG_OPT_FLASHMLA_SPARSE_PREFILL.override(flags.SGLANG_OPT_FLASHMLA_SPARSE_PREFILL))
        stack.enter_context(api.mods["runtime"].get_memory().override(
            enable_hierarchical_cache=flags.hierarchical_cache,
            hicache_storage_backend="file" if flags.hicache_storage else None, enable_lmcache=flags.lmcache))
        cp_base._STRATEGY = _ActiveCP() if flags.cp_active else None
        try:
            yield
        finally:
            cp_base._STRATEGY = saved_cp


@contextlib.contextmanager
def swa_window(api, window: int):
    """SGLang's SWA window is the module constant SWA_WINDOW (128); the harness's models are smaller."""
    mod = api.mods["backend"]
    saved, mod.SWA_WINDOW = mod.SWA_WINDOW, window
    try:
        yield
    finally:
        mod.SWA_WINDOW = saved


# -- the session --------------------------------------------------------------------------------------------

class SglangSession(ReferenceSession):
    """Pools, world loading and the harness's model parts come from the reference session; the decisions,
    the snapshot, the publication and the barrier are SGLang's."""

    # What triage checks on the real backend: the methods this target drives for real (metadata init and
    # the model forward are the harness's, so their attribute needs are not the object's contract here).
    contract_entry_points = ("resolve_prefill_shared_read_ends", "shared_read_ends")

    def __init__(self, api, case: Case, device):
        if case.semantics != api.semantics:
            raise InvalidArgument(f"case semantics={case.semantics!r}: the installed {api.describe()} implements "
                                  f"--semantics {api.semantics} only")
        api.check_device(device.kind)
        super().__init__(case, device, Classes())
        self.api = api
        self.harness_runner = self.model_runner  # the harness model: metadata init, KV stores, indexer, readers
        self.model_runner = SglangModelRunner(self)
        sched_mod = api.mods["scheduler"]
        spec = self.model_runner.spec_algorithm
        if spec.is_none():
            worker = _Worker(api.mods["tp_worker"].BaseTpWorker, model_runner=self.model_runner)
        else:
            worker = _Worker(api.mods["spec_worker"].BaseSpecWorker,
                             target_worker=SimpleNamespace(model_runner=self.model_runner))
        # Scheduler.__init__ computes `is_cuda() or SGLANG_ENABLE_WAR_BARRIER`: the harness models a CUDA host.
        self.scheduler_stub = SimpleNamespace(_war_barrier_enabled=True, model_worker=worker,
                                              schedule_stream=_StreamShim(device, device.schedule_stream),
                                              forward_stream=_StreamShim(device, device.forward_stream))
        self.scheduler = _SglangBarrierScheduler(
            device, self.model_runner, case.flags,
            real_barrier=lambda: sched_mod.Scheduler._apply_war_barrier(self.scheduler_stub))

    def load(self, world) -> ForwardBatch:
        """The reference's allocation, with the per-batch tensors in SGLang's dtypes: `seq_lens` and
        `req_pool_indices` are int64 in ScheduleBatch/ForwardBatch (`extend_seq_lens` int32, as here). The
        dtype matters: the real chunk cache keeps `seq_lens.to(torch.int32)`, a private copy only when the
        batch's tensor is not already int32 (an int32 one would be aliased and re-read by every layer)."""
        fb = super().load(world)
        return dataclasses.replace(fb, seq_lens=fb.seq_lens.to(torch.int64),
                                   req_pool_indices=fb.req_pool_indices.to(torch.int64))

    def step(self, fb, *, graph, process_batch_result, after_launch):
        """The reference's overlap-loop iteration, under SGLang's config, with SGLang's `_apply_war_barrier`."""
        with sglang_config(self.api, self.case):
            return super().step(fb, graph=graph, process_batch_result=process_batch_result,
                                after_launch=after_launch)

    def chunk_cache(self):
        """The real SparsePrefillChunkCache of the last forward, if one was built (after synchronize)."""
        metadata = self.model_runner.attn_backend.forward_metadata
        holder = getattr(metadata, "sparse_prefill_cache", None)
        return holder.value if isinstance(holder, DeferredChunkCache) else holder


class _SglangBarrierScheduler(Scheduler):
    """One overlap-loop iteration as the reference runs it, the barrier being SGLang's own."""

    def __init__(self, device, model_runner, flags, *, real_barrier):
        super().__init__(device, model_runner, flags)
        self._real_barrier = real_barrier

    def _apply_war_barrier(self) -> None:
        self._real_barrier()


class SglangModelRunner:
    """What SGLang's ModelRunner is to the real code: the spec algorithm, the backend and the event mailbox."""

    def __init__(self, session: SglangSession):
        api, case, device = session.api, session.case, session.device
        self.session, self.api, self.case, self.device = session, api, case, device
        self.probe = session.probe
        self.harness = session.harness_runner
        self.token_to_kv_pool = session.token_to_kv_pool  # what the HiCache backup copies
        self.spec_algorithm = api.mods["spec"].SpeculativeAlgorithm.from_string(case.spec.name)
        self.shared_read_done_event = None
        self.device_module = DeviceModuleShim(device, self.probe)
        self.attn_backend = self._build_backend()
        self.graph_runner = SglangPrefillGraphRunner(self, contract=case.graph_contract)

    # -- the object-built backend ------------------------------------------------------------------

    def _build_backend(self):
        api, session = self.api, self.session
        backend = object.__new__(api.backend_cls)  # as SGLang's own unit tests build it
        backend.model_runner = self
        backend.device = self.device.torch_device
        backend.req_to_token_pool = session.req_to_token_pool
        backend.req_to_token = session.req_to_token_pool.req_to_token
        backend.token_to_kv_pool = PoolShim(session.token_to_kv_pool, self.device, self.probe)
        backend.hisparse_coordinator = object() if self.case.flags.hisparse else None
        backend.forward_metadata = None
        backend.sparse_prefill_kv_buffer = api.mods["sparse_utils"].SparsePrefillKVBuffer(self.device.torch_device)
        backend.init_forward_metadata = self._init_forward_metadata
        backend.prepare_forward_metadata_for_breakable_cuda_graph_replay = self._prepare_bcg_replay
        backend._build_sparse_prefill_chunk_cache = self._deferred_chunk_cache
        self._build_label = "sparse_prefill_cache.build"
        self.builds_issued = 0
        return backend

    def _fresh_metadata(self, fb: ForwardBatch):
        core = CoreMetadata.wrap(self.harness.attn_backend.build_core_metadata(fb), self.device)
        return self.api.mods["backend"].DSV4Metadata(core_attn_metadata=core, indexer_metadata=None)

    def _init_forward_metadata(self, view: BatchView) -> None:
        """Replaced: the harness's metadata init (the real one plans FlashMLA and JIT kernels)."""
        fresh = self._fresh_metadata(view.harness)
        static = view.graph_static
        backend = self.attn_backend
        if static is None:
            backend.forward_metadata = fresh
            return
        static.copy_(fresh)  # the real DSV4Metadata.copy_: in-place core copy, sparse_prefill_cache = None
        self._note_reuse(static)
        backend.forward_metadata = static

    def _prepare_bcg_replay(self, capture_metadata, forward_batch: BatchView, *, static_forward_batch=None) -> None:
        """Replaced: rebuild fresh metadata from the padded static batch, refresh the captured object."""
        batch = static_forward_batch if static_forward_batch is not None else forward_batch
        fresh = self._fresh_metadata(batch.harness)
        capture_metadata.refresh_for_breakable_cuda_graph_replay_(fresh)  # real: resets sparse_prefill_cache
        dst, src = capture_metadata.core_attn_metadata.swa_out_cache_loc, fresh.core_attn_metadata.swa_out_cache_loc
        self.device.launch("metadata.swa_out_cache_loc.copy_", lambda: dst.copy_(src),
                           reads={"meta.fresh": None}, writes={"meta.static": None})
        self._note_reuse(capture_metadata)
        self.attn_backend.forward_metadata = capture_metadata

    def _note_reuse(self, metadata) -> None:
        self.probe.note("metadata_reuse", cache_reset=metadata.sparse_prefill_cache is None,
                        flag_reset=not getattr(metadata, "prefill_shared_reads_snapshotted", False))

    def _deferred_chunk_cache(self, forward_batch: BatchView, core_attn_metadata, *, num_qo_tokens: int):
        """The real `_build_sparse_prefill_chunk_cache`, run inside a launched closure; returns its holder."""
        api, backend, dev = self.api, self.attn_backend, self.device
        holder = DeferredChunkCache(num_qo_tokens, self._build_label)
        metadata = backend.forward_metadata  # bound at issue time, as a launch binds its pointers
        window = self.case.dims.swa_window
        build = api.backend_cls._build_sparse_prefill_chunk_cache
        self.builds_issued += 1

        def run():
            saved = backend.forward_metadata
            backend.forward_metadata = metadata
            try:
                with swa_window(api, window):
                    holder.value = build(backend, forward_batch, core_attn_metadata, num_qo_tokens=num_qo_tokens)
            finally:
                backend.forward_metadata = saved

        rows = frozenset(forward_batch.harness.req_pool_indices_cpu)
        dev.launch(self._build_label, run,
                   reads={"req_to_token": rows, "full_to_swa": None, "fb.req_pool_indices": None, "fb.seq_lens": None,
                          "fb.extend_seq_lens": None, "meta.seq_lens_casual": None},
                   writes={"cache.swa_token_ids": None, "cache.c0_combined_indices": None})
        return holder

    # -- views and the snapshot note -----------------------------------------------------------------

    def view(self, fb: ForwardBatch, mode=None, graph_static=None) -> BatchView:
        real_modes = self.api.mods["forward"].ForwardMode
        mode = mode if mode is not None else real_modes[_MODE_NAMES.get(fb.forward_mode, fb.forward_mode.name)]
        return BatchView(forward_mode=mode, batch_size=fb.batch_size, input_ids=fb.input_ids,
                         req_pool_indices=fb.req_pool_indices, seq_lens=fb.seq_lens,
                         seq_lens_cpu=torch.tensor(fb.seq_lens_cpu, dtype=torch.int64),
                         extend_seq_lens=fb.extend_seq_lens, extend_seq_lens_cpu=list(fb.extend_seq_lens_cpu),
                         positions=fb.positions, out_cache_loc=fb.out_cache_loc, harness=fb, graph_static=graph_static)

    def resolve_and_publish(self, view: BatchView, *, num_qo_tokens: int, resolve: Callable[[], Any]) -> None:
        """The runner's WAR boundary: resolve (0.5.23) or prepare the snapshot (PR era), then the real publisher."""
        issued = self.builds_issued
        self._build_label = "sparse_prefill_cache.build"
        publish = self.api.mods["publisher"].maybe_publish_prefill_shared_read_done
        if self.api.semantics == "0.5.23":
            ends = resolve()
            if ends is self.api.mods["base_backend"].SharedReadEnds.PRE_REPLAY:
                self.probe.note("snapshot", num_qo_tokens=num_qo_tokens, sparse=self.builds_issued > issued)
            publish(self, ends, self.device_module)
        else:
            resolve()
            if getattr(self.attn_backend.forward_metadata, "prefill_shared_reads_snapshotted", False):
                self.probe.note("snapshot", num_qo_tokens=num_qo_tokens, sparse=self.builds_issued > issued)
            publish(self, view, self.device_module)

    # -- forward -----------------------------------------------------------------------------------

    def forward(self, fb: ForwardBatch, *, graph: bool) -> dict[str, torch.Tensor]:
        self.probe.note("batch", mode=fb.forward_mode.name, tokens=fb.num_tokens)
        if fb.forward_mode.is_idle():
            return {}
        # The prefill graph runner takes extends (not decode, not target-verify: can_replay_locally refuses it).
        if (graph and fb.forward_mode not in (HForwardMode.DECODE, HForwardMode.TARGET_VERIFY)
                and self.graph_runner.can_run_graph(fb.num_tokens)):
            out = self.graph_runner.execute(fb)
        else:
            out = self.eager_forward(fb)
        outputs = {"attention": out}
        self.harness.attn_backend.forward_metadata = self.attn_backend.forward_metadata
        outputs.update(self.harness.run_speculative_tail(fb))
        return outputs

    def eager_forward(self, fb: ForwardBatch) -> torch.Tensor:
        """`EagerRunner.execute` / `_execute_extend` / `_execute_decode`, replicated: the model is not built."""
        api, backend = self.api, self.attn_backend
        modes = api.mods["forward"].ForwardMode
        view = self.view(fb)
        if view.forward_mode == modes.MIXED and api.mods["cp_base"].get_cp_strategy() is None:
            view.forward_mode = modes.EXTEND  # EagerRunner.execute: a mixed batch runs as EXTEND
        if view.forward_mode.is_decode():
            backend.init_forward_metadata(view)
        elif view.forward_mode.is_extend(include_draft_extend_v2=True):
            backend.init_forward_metadata(view)
            n = len(view.input_ids)
            if api.semantics == "0.5.23":
                resolve = lambda: backend.resolve_prefill_shared_read_ends(view, num_qo_tokens=n)  # noqa: E731
            else:
                resolve = lambda: backend.prepare_prefill_shared_read_snapshot(view, num_qo_tokens=n)  # noqa: E731
            self.resolve_and_publish(view, num_qo_tokens=n, resolve=resolve)
        else:
            raise ValueError(f"Invalid forward mode for eager runner: {view.forward_mode}")
        return self.run_model(fb, view)

    def run_model(self, fb: ForwardBatch, view: BatchView, store_compressed=None) -> torch.Tensor:
        dims = self.case.dims
        out = torch.zeros(len(dims.layer_ratios), fb.num_tokens, dims.heads, dims.head_dim,
                          device=self.device.torch_device)
        self.forward_layers(fb, view, out, store_compressed)
        return out

    def forward_layers(self, fb: ForwardBatch, view: BatchView, out: torch.Tensor, store_compressed=None) -> None:
        api, backend, harness = self.api, self.attn_backend, self.harness.attn_backend
        harness.forward_metadata = backend.forward_metadata
        rows = fb.num_tokens
        if api.mods["cp_utils"].is_cp_active(view):  # CP shards the query layout inside the forward
            harness._late_refresh_swa_rows("cp.shard_metadata", fb, range(rows))
        sparse = backend._use_sparse_prefill(view, num_qo_tokens=rows)
        self.probe.note("forward", rows=rows, sparse=sparse)
        for layer, ratio in enumerate(self.case.dims.layer_ratios):
            self._store_swa(fb, view, layer)
            if store_compressed is not None:
                store_compressed(layer)
            else:
                harness.store_compressed(fb, layer, backend.forward_metadata.core_attn_metadata)
            if ratio == 4:
                harness._indexer(fb, layer)
            if sparse:
                self._attend_sparse(fb, view, layer, out)
            else:
                harness._attend_dense(fb, layer, out)

    def _store_swa(self, fb: ForwardBatch, view: BatchView, layer: int) -> None:
        backend = self.attn_backend
        loc = backend.get_swa_out_cache_loc(view)  # real: the snapshot, or a re-translation through the live map
        cached = loc is backend.forward_metadata.core_attn_metadata.swa_out_cache_loc
        swa_kv = self.session.token_to_kv_pool.swa_kv

        def store():
            swa_kv[layer].index_copy_(0, loc.long(), fb.kv_new[layer])

        self.device.launch(f"layer{layer}.store_swa", store,
                           reads={"meta.swa_out_cache_loc" if cached else "tmp.swa_loc": None},
                           writes={f"swa_kv[{layer}]": None})

    def _attend_sparse(self, fb: ForwardBatch, view: BatchView, layer: int, out: torch.Tensor) -> None:
        """`_forward_prefill_sparse` with FlashMLA replaced: the real cache's combined indices over a workspace
        gathered from the harness's KV (compressed region first, then the SWA region, SGLang's layout)."""
        backend, harness, dims = self.attn_backend, self.harness.attn_backend, self.case.dims
        metadata = backend.forward_metadata
        core = metadata.core_attn_metadata
        rows = fb.num_tokens
        if metadata.sparse_prefill_cache is None:  # what the real layer does: build lazily (a late read)
            self._build_label = f"layer{layer}.sparse_prefill_cache.lazy_build"
            metadata.sparse_prefill_cache = backend._build_sparse_prefill_chunk_cache(
                view, core, num_qo_tokens=rows)
            self.probe.note("lazy_build", layer=layer)
        holder = metadata.sparse_prefill_cache
        if holder.num_qo_tokens != rows:
            raise RuntimeError(f"sparse prefill cache built for {holder.num_qo_tokens} query rows, "
                               f"the forward has {rows}")
        pool, ratio, sink = self.session.token_to_kv_pool, dims.layer_ratios[layer], self.session.sink[layer]
        page_table, raw4, c128 = core.page_table, core.c4_sparse_raw_indices, core.c128_page_indices
        core_view = SimpleNamespace(sparse_page_indices=lambda r: c128 if r == 128 else None)  # bound at issue
        ps, scale = dims.page_size, dims.head_dim ** -0.5
        hisparse = self.case.flags.hisparse

        def attend():
            cache = holder.get()
            swa_region = pool.swa_kv[layer][cache.swa_token_ids.long()]
            if ratio == 0:
                kv, idx = swa_region, cache.c0_combined_indices
            else:
                if ratio == 128:
                    flat, idx, _ = cache.layer_inputs(128, core_view, 1)
                else:  # the harness keys compressed entries by the full slot of a block's first token
                    c_max = max(cache.max_seq_len // ratio, 1)
                    starts = (torch.arange(c_max, device=page_table.device) * ratio)[None, :]
                    block_table = page_slot(page_table, starts.expand(page_table.shape[0], -1), ps)
                    flat = cache.ensure_compressed(ratio, block_table, 1).flat_token_ids
                    idx, _ = cache.combine_compressed(ratio, raw4[: cache.num_qo_tokens].to(torch.int32))
                slots = harness._compressed_slots(flat.long())[0] if hisparse else flat.long()
                kv = torch.cat([pool.extra_kv[layer][slots.clamp(min=0)], swa_region])
            out[layer].copy_(sparse_attention_on(kv.device)(fb.q[layer], kv, idx.long(), sink, scale))

        reads = {f"swa_kv[{layer}]": None, "cache.swa_token_ids": None, "cache.c0_combined_indices": None}
        if ratio:
            reads[f"extra_kv[{layer}]"] = None
            reads["meta.c4_sparse_raw_indices" if ratio == 4 else "meta.c128_page_indices"] = None
            reads["meta.page_table"] = None
            if hisparse:
                reads["full_to_hisparse"] = None
        self.device.launch(f"layer{layer}.attention.sparse", attend, reads=reads,
                           writes={"out": None, "cache.compressed": None})


class SglangPrefillGraphRunner:
    """The prefill graph runner: graphs emulated as in the reference (captured KV stores keep their tensors),
    the replay's metadata prep and WAR boundary through the real `_prepare_forward_metadata_for_replay`."""

    def __init__(self, model_runner: SglangModelRunner, *, contract: str):
        api = model_runner.api
        self.mr, self.api, self.contract = model_runner, api, contract
        self.capture_bs = api.mods["buckets"].generate_prefill_cuda_graph_batch_sizes(GRAPH_MAX_BS)
        self.static_metadata: dict[int, Any] = {}
        self.graphs: dict[int, list] = {}
        self.static_inputs: dict[int, ForwardBatch] = {}
        self.stub = SimpleNamespace(model_runner=model_runner, _is_full_backend=False,
                                    use_captured_attn_metadata=contract == "bcg", attn_metadata_buffers={})

    def _bucket(self, num_tokens: int) -> Optional[int]:
        if num_tokens < 1 or num_tokens > self.capture_bs[-1]:
            return None
        return self.api.mods["base_graph_runner"].BaseCudaGraphRunner._pad_to_bucket(num_tokens, self.capture_bs)

    def can_run_graph(self, num_tokens: int) -> bool:
        bucket = self._bucket(num_tokens)
        factor = self.api.mods["graph_runner"]._MAX_PREFILL_CUDA_GRAPH_PADDING_FACTOR
        return bucket is not None and bucket <= num_tokens * factor

    def execute(self, fb: ForwardBatch) -> torch.Tensor:
        mr, api = self.mr, self.api
        bucket = self._bucket(fb.num_tokens)
        padded = pad_forward_batch(fb, bucket)
        mr.probe.note("graph_replay", bucket=bucket, tokens=fb.num_tokens)
        if bucket not in self.static_metadata:
            self._capture(bucket, padded)
        self._load_static_inputs(bucket, padded)
        static = self.static_metadata[bucket]
        modes = api.mods["forward"].ForwardMode
        live = mr.view(padded, graph_static=static)
        static_view = mr.view(padded, mode=modes.EXTEND if live.forward_mode == modes.MIXED else live.forward_mode,
                              graph_static=static)  # MIXED replays the EXTEND-captured graphs
        if api.semantics == "0.5.23":
            shape_key = api.mods["shape_key"].ShapeKey(size=bucket)
            self.stub.attn_metadata_buffers = {shape_key: static}
            prepare = api.mods["graph_runner"].PrefillCudaGraphRunner._prepare_forward_metadata_for_replay
            mr.resolve_and_publish(live, num_qo_tokens=bucket,
                                   resolve=lambda: prepare(self.stub, live, static_view, shape_key))
        else:
            if self.contract == "bcg":
                mr.attn_backend.prepare_forward_metadata_for_breakable_cuda_graph_replay(
                    static, live, static_forward_batch=static_view)
            else:
                mr.attn_backend.init_forward_metadata(live)
            mr.resolve_and_publish(live, num_qo_tokens=bucket, resolve=lambda: (
                mr.attn_backend.prepare_prefill_shared_read_snapshot(live, num_qo_tokens=bucket)
                if self.contract == "fresh" else None))
        out = mr.run_model(padded, static_view, store_compressed=lambda layer: mr.device.replay(self.graphs[bucket][layer]))
        return out[:, : fb.num_tokens]

    def _load_static_inputs(self, bucket: int, padded: ForwardBatch) -> None:
        static = self.static_inputs[bucket]

        def load():
            static.compressed_new.copy_(padded.compressed_new)
            static.index_k_new.copy_(padded.index_k_new)

        self.mr.device.launch("load_batch.static_inputs", load, writes={"static_inputs": None})

    def _capture(self, bucket: int, padded: ForwardBatch) -> None:
        mr = self.mr
        static = mr._fresh_metadata(padded)
        self.static_metadata[bucket] = static
        self.static_inputs[bucket] = static_fb = dataclasses.replace(
            padded, compressed_new=padded.compressed_new.clone(), index_k_new=padded.index_k_new.clone())
        graphs = []
        for layer in range(len(mr.case.dims.layer_ratios)):
            with mr.device.capture(f"prefill_graph[{bucket}].layer{layer}") as graph:
                mr.harness.attn_backend.store_compressed(static_fb, layer, static.core_attn_metadata)
            graphs.append(graph)
        self.graphs[bucket] = graphs


__all__ = ["SglangSession", "SglangModelRunner", "BACKEND_ATTRIBUTES", "BACKEND_HOOKS", "CORE_METADATA_FIELDS",
           "FORWARD_BATCH_FIELDS"]
