"""What SGLang's own code asks of its platform, answered by the harness's device.

SGLang's runners and scheduler reach the device through `torch.get_device_module(model_runner.device)`
(the eager runner's publisher), `self.device_module` (the graph runner, the scheduler's stream context)
and stream objects (`schedule_stream.wait_event`, `wait_stream`). On CUDA those are torch's own: the
model runner's device is `"cuda"`, SGLang creates and records real `torch.cuda.Event`s on torch's current
stream (the harness's forward stream), and `CudaEventBridge` tells the happens-before tracker where each
was recorded and which stream waited on it.

On the CPU there are no streams, so the simulator is registered with torch as a device of its own
(`streamsim`, torch's PrivateUse1 slot renamed) whose module is `SimDeviceModule`: its `Event.record(stream)`
records on the simulator stream it is given, or on the current one, as CUDA does, so an event SGLang
records on the wrong stream is recorded there, and the tracker sees it.

The runtime context: a server publishes its configuration namespaces at start (`server.publish`, SGLang's
own resolution of a tiny DSV4 model's arguments); `sglang_config` sets the case's switches (and one rank of
each parallel width) through SGLang's own override objects.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import sys
import types
from typing import Iterator, Optional

import torch

from harness.case import CP_SIZE, Case
from harness.device import DeviceKind
from harness.device.base import Device, Event, Stream
from harness.errors import EnvironmentBroken

SIM_BACKEND = "streamsim"  # torch's device-string parser takes letters only


def _parallel(cp_size: int) -> dict:
    """A server of one attention-TP rank and `cp_size` CP ranks, consistent as SGLang checks on every override:
    tp = attn_tp * attn_dp * attn_cp = moe_ep * moe_dp * moe_tp. A case that turns CP on runs on a server of the
    harness's CP width, any other on a server without CP (which SGLang's ragged verify planning requires)."""
    return {"attn_dcp_size": 1, "pp_size": 1, "attn_cp_size": cp_size, "attn_tp_size": 1, "tp_size": cp_size,
            "moe_tp_size": cp_size, "moe_ep_size": 1, "moe_dp_size": 1}


# The attention-DP width's override name: `num_dp_ranks` in 0.5.23, `attn_dp_size` before.
_DP_WIDTH_NAMES = ("num_dp_ranks", "attn_dp_size")


# -- the simulator as a torch device ---------------------------------------------------------------------

class SimStream:
    """A simulator stream as SGLang's code holds one (`torch.cuda.Stream`'s methods it calls)."""

    def __init__(self, device: Device, stream: Stream):
        self.device, self.stream = device, stream

    @property
    def cuda_stream(self) -> int:  # the scheduler compares handles to refuse aliased streams
        return self.stream.id

    def wait_event(self, event: "SimEvent") -> None:
        recorded = getattr(event, "recorded", None)  # another device's event records nothing here
        if recorded is not None:  # CUDA: waiting on an event never recorded is a no-op
            self.device.wait_event(self.stream, recorded)

    def wait_stream(self, other: "SimStream") -> None:
        self.device.wait_stream(self.stream, other.stream)


class SimEvent:
    """`device_module.Event()` on the simulator: `record(stream)` records on that stream, or on the current
    one, as CUDA does."""

    def __init__(self, *args, **kwargs):
        self.device = SimDeviceModule.bound_device()
        self.recorded: Optional[Event] = None
        self.stream: Optional[Stream] = None

    def record(self, stream: Optional[SimStream] = None) -> None:
        self.stream = stream.stream if stream is not None else self.device.current_stream
        self.recorded = self.device.record_event(self.stream)


class SimDeviceModule(types.ModuleType):
    """`torch.streamsim`: the device module of the simulator, bound to one session's device at a time."""

    _bound: Optional[Device] = None

    Event = SimEvent

    def __init__(self):
        super().__init__(SIM_BACKEND)

    @classmethod
    def bound_device(cls) -> Device:
        if cls._bound is None:
            raise RuntimeError(f"torch.{SIM_BACKEND} used outside a session: no simulator device is bound")
        return cls._bound

    @classmethod
    @contextlib.contextmanager
    def bind(cls, device: Device) -> Iterator[None]:
        saved, cls._bound = cls._bound, device
        try:
            yield
        finally:
            cls._bound = saved

    def Stream(self, *args, **kwargs) -> SimStream:  # noqa: N802 - torch's name
        device = self.bound_device()
        return SimStream(device, device.new_stream("sglang-new"))

    @contextlib.contextmanager
    def StreamContext(self, stream: SimStream) -> Iterator[None]:  # noqa: N802 - torch's name
        with stream.device.stream(stream.stream):
            yield


# glibc's mallopt parameters, and the bound: glibc's own initial mmap threshold.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_HEAP_BOUND = 128 * 1024


def bound_heap_growth() -> bool:
    """Fix glibc's mmap threshold at its initial 128 KiB (and the trim threshold with it), for the process.

    glibc raises the threshold each time a large block is freed, so the megabyte-sized tensors of DSV4-sized
    cases (page 256, head_dim 512: a case of 11674 tokens allocates gigabytes) come from the heap after the first
    case, which fragments and is never returned: measured, one such case run three times grew the process from
    3.4 to 5.2 GB, and a 100-case campaign on the CPU was killed out of memory (24 GB) at its 99th case. With the
    threshold fixed the same runs stay at 2.5 GB. Returns whether it applied (glibc only; elsewhere nothing)."""
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, _HEAP_BOUND)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, _HEAP_BOUND))


def register_sim_device() -> str:
    """Register the simulator as torch's PrivateUse1 device (once per process); its device string."""
    name = torch._C._get_privateuse1_backend_name()
    if name == SIM_BACKEND and isinstance(getattr(torch, SIM_BACKEND, None), SimDeviceModule):
        return SIM_BACKEND
    if name != "privateuseone":
        raise EnvironmentBroken(f"--target sglang --device cpu: torch's PrivateUse1 device is already {name!r}; "
                                f"the simulator registers itself there as {SIM_BACKEND!r}")
    torch.utils.rename_privateuse1_backend(SIM_BACKEND)
    torch._register_device_module(SIM_BACKEND, SimDeviceModule())
    return SIM_BACKEND


# -- CUDA: real events and streams, observed ----------------------------------------------------------------

_TORCH_DIR = os.path.dirname(torch.__file__)
_SGLANG_MARK = f"{os.sep}sglang{os.sep}"


def _issued_by_sglang() -> bool:
    """Whether the first frame outside torch and this module (the code that called torch) is SGLang's."""
    frame = sys._getframe(1)
    while frame is not None and (frame.f_code.co_filename.startswith(_TORCH_DIR)
                                 or frame.f_code.co_filename == __file__):
        frame = frame.f_back
    return frame is not None and _SGLANG_MARK in frame.f_code.co_filename


class CudaEventBridge:
    """Real `torch.cuda.Event`s and stream waits of SGLang's code, placed in the happens-before tracker.

    While a session's step runs, `torch.cuda.Event` is a subclass of itself (`bound`) whose `record`
    also tells the bridge: a record issued by SGLang's code gets a harness event id and is recorded in
    the tracker on the harness stream it was recorded on, or on a stream of its own when SGLang recorded
    it on a stream the harness does not own (then it orders nothing). The scheduler's streams are torch
    streams over the harness's (`TrackedStream`), whose `wait_event` / `wait_stream` feed the tracker; a stream
    SGLang creates itself while the step runs (`torch.cuda.Stream(...)`: 0.5.19's `run_event_loop` makes its
    own schedule stream) is a new harness stream, as the simulator's `Stream()` gives one.
    The events stay real CUDA events on the real streams. (torch's GPU trace would see the same, but once
    on it calls into Python at every allocation, also while an exception unwinds, which replaces the
    system under test's own error with a SystemError.)"""

    def __init__(self, device: Device):
        self.device = device
        self.events: dict[int, tuple[Event, Stream]] = {}
        self.foreign: dict[int, Stream] = {}
        self.created: dict[int, Stream] = {}  # CUDA handle -> the harness stream of a stream made for SGLang
        self.pending_delay = False
        real = torch.cuda.Event
        bridge = self

        class TrackedEvent(real):
            def record(self, stream=None):
                super().record(stream)
                if _issued_by_sglang():
                    bridge.recorded(self, stream if stream is not None else torch.cuda.current_stream())

        real_stream = torch.cuda.Stream

        class NewStream(real_stream):
            def __new__(cls, *args, **kwargs):
                if "stream_id" in kwargs or "stream_ptr" in kwargs:  # torch naming a stream that exists
                    return real_stream(*args, **kwargs)  # (`current_stream()` builds its answer so)
                return bridge.stream(bridge.device.new_stream("sglang-new"))

        self._real_event, self._tracked_event = real, TrackedEvent
        self._real_stream, self._new_stream = torch.cuda.Stream, NewStream

    @contextlib.contextmanager
    def bound(self) -> Iterator[None]:
        torch.cuda.Event, torch.cuda.Stream = self._tracked_event, self._new_stream
        try:
            yield
        finally:
            torch.cuda.Event, torch.cuda.Stream = self._real_event, self._real_stream

    def stream_of(self, handle: int) -> Stream:
        """The harness stream with this CUDA handle, or a stream of its own for one the harness does not own."""
        for stream in (self.device.forward_stream, self.device.schedule_stream):
            if self.device.native(stream).cuda_stream == handle:
                return stream
        if handle in self.created:
            return self.created[handle]
        if handle not in self.foreign:
            self.foreign[handle] = self.device.new_stream(f"sglang-{handle:x}")
        return self.foreign[handle]

    def recorded(self, native, stream) -> None:
        harness_stream = self.stream_of(stream.cuda_stream)
        event = Event(self.device.new_event_id(), native)
        self.device.tracker.record(event.id, harness_stream.id)
        self.events[native.cuda_event] = (event, harness_stream)
        self.pending_delay = harness_stream is self.device.forward_stream

    def where_recorded(self, native) -> Optional[tuple[Event, Stream]]:
        return self.events.get(getattr(native, "cuda_event", None))

    def stream(self, harness_stream: Stream) -> "TrackedStream":
        tracked = TrackedStream(stream_ptr=self.device.native(harness_stream).cuda_stream)
        tracked.bridge, tracked.harness = self, harness_stream
        self.created.setdefault(tracked.cuda_stream, harness_stream)
        return tracked


class TrackedStream(torch.cuda.ExternalStream):
    """A harness stream as the torch stream SGLang's scheduler holds; its waits also feed the tracker."""

    bridge: CudaEventBridge
    harness: Stream

    def wait_event(self, event) -> None:
        recorded = self.bridge.where_recorded(event)
        if recorded is not None:
            self.bridge.device.tracker.wait(self.harness.id, recorded[0].id)
        super().wait_event(event)

    def wait_stream(self, stream) -> None:
        other = getattr(stream, "harness", None) or self.bridge.stream_of(stream.cuda_stream)
        self.bridge.device.tracker.wait_stream(self.harness.id, other.id)
        super().wait_stream(stream)


def sglang_op(op, kernels_on: DeviceKind):
    """A custom op of SGLang's own Python (`register_custom_op`: `op` the model's callable, the registered op to
    0.5.22, 0.5.23's eager shortcut to it), callable on the harness's device. SGLang registers the function as the
    op's kernel for one dispatch key, CUDA's on a host that is neither NPU, XPU nor MUSA
    (`direct_register_custom_op`), and 0.5.23's shortcut calls the function itself only for CUDA tensors. On the
    CPU simulator, whose tensors are the CPU's, torch finds no kernel for them: there the registered op is
    redispatched to the CUDA key, which runs SGLang's function on the tensors it is given. On CUDA the op is
    called as the model calls it."""
    if kernels_on is DeviceKind.CUDA:
        return op
    overload, cuda = getattr(torch.ops.sglang, op.__name__).default, torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)
    return lambda *args: overload.redispatch(cuda, *args)


# -- the runtime context and the case's switches -------------------------------------------------------

def _parallel_fields(api) -> frozenset:
    """The names this version's `get_parallel().override` accepts (a constant before 0.5.23, derived since)."""
    runtime = api.mods["runtime"]
    fields = getattr(runtime, "_PARALLEL_FIELDS", None)
    return fields if fields is not None else runtime._parallel_fields()


def one_dp_rank(api) -> dict:
    """`get_parallel().override(**one_dp_rank(api))`: one attention-DP rank, by this version's name."""
    fields = _parallel_fields(api)
    name = next((n for n in _DP_WIDTH_NAMES if n in fields), None)
    if name is None:
        raise EnvironmentBroken(f"--target sglang: this sglang's parallel overrides name no DP width "
                                f"(none of {', '.join(_DP_WIDTH_NAMES)})")
    return {name: 1}


def rank_zero(api) -> dict:
    """`get_parallel().override(**rank_zero(api))`: this process is rank 0 of the TP group and of the attention-TP
    group, where this version names the latter (0.5.21's runners read `attn_tp_rank`, which only a server's rank
    bundle writes; 0.5.23's published server has it)."""
    return {name: 0 for name in ("tp_rank", "attn_tp_rank", "attn_cp_rank") if name in _parallel_fields(api)}


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


@contextlib.contextmanager
def cp_rank(api, rank: int) -> Iterator[None]:
    """This process as CP rank `rank` of the harness's CP width: what SGLang's CP code asks
    (`get_parallel().attn_cp_rank`) while it plans or runs that rank's rows."""
    with api.mods["runtime"].get_parallel().override(attn_cp_rank=rank):
        yield


@contextlib.contextmanager
def sglang_config(api, case: Case) -> Iterator[None]:
    """The case's switches, set through SGLang's own configuration objects, for the host-side calls."""
    flags, envs = case.flags, api.mods["environ"].envs
    runtime, cp_base = api.mods["runtime"], api.mods["cp_base"]
    saved_cp = cp_base._STRATEGY
    with contextlib.ExitStack() as stack:
        stack.enter_context(_scoped_env(envs.SGLANG_ENABLE_PREFILL_WAR_READ_DONE, flags.SGLANG_ENABLE_PREFILL_WAR_READ_DONE))
        stack.enter_context(envs.SGLANG_FORCE_COARSE_WAR_BARRIER.override(flags.SGLANG_FORCE_COARSE_WAR_BARRIER))
        stack.enter_context(envs.SGLANG_OPT_FLASHMLA_SPARSE_PREFILL.override(flags.SGLANG_OPT_FLASHMLA_SPARSE_PREFILL))
        stack.enter_context(runtime.get_memory().override(
            enable_hierarchical_cache=flags.hierarchical_cache,
            hicache_storage_backend="file" if flags.hicache_storage else None, enable_lmcache=flags.lmcache))
        parallel = {**_parallel(CP_SIZE if flags.cp_active else 1), **one_dp_rank(api)}
        if "enable_cp_tp_group_sharing" in _parallel_fields(api):  # 0.5.23: the model owns the CP row layout
            parallel["enable_cp_tp_group_sharing"] = flags.cp_active
        stack.enter_context(runtime.get_parallel().override(**parallel))
        if hasattr(envs, "SGLANG_ENABLE_CP_V2"):  # 0.5.19: CP runs only with CP-v2 switched on
            stack.enter_context(envs.SGLANG_ENABLE_CP_V2.override(flags.cp_active))
        # SGLang's interleave CP strategy, as `--enable-prefill-cp --cp-strategy interleave` binds it (the layout DSV4's
        # CP-TP group sharing runs): its own `can_apply` decides which batches it shards (`Flags.cp_shards`)
        cp_base._STRATEGY = api.mods["cp_interleave"].InterleaveCPStrategy(cp_size=CP_SIZE) if flags.cp_active else None
        try:
            yield
        finally:
            cp_base._STRATEGY = saved_cp


@contextlib.contextmanager
def swa_window(api, window: int) -> Iterator[None]:
    """SGLang's SWA window is the module constant SWA_WINDOW (128); the harness's models are smaller."""
    mod = api.mods["backend"]
    saved, mod.SWA_WINDOW = mod.SWA_WINDOW, window
    try:
        yield
    finally:
        mod.SWA_WINDOW = saved
