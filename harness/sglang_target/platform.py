"""What SGLang's own code asks of its platform, answered by the harness's device.

SGLang's runners and scheduler reach the device through `torch.get_device_module(model_runner.device)`
(the eager runner's publisher), `self.device_module` (the graph runner, the scheduler's stream context)
and stream objects (`schedule_stream.wait_event`, `wait_stream`). On CUDA those are torch's own: the
model runner's device is `"cuda"`, SGLang creates and records real `torch.cuda.Event`s on torch's current
stream (the harness's forward stream), and `CudaEventBridge` tells the happens-before tracker where each
was recorded, from torch's GPU trace callbacks (what PyTorch's CSAN uses).

On the CPU there are no streams, so the simulator is registered with torch as a device of its own
(`streamsim`, torch's PrivateUse1 slot renamed) whose module is `SimDeviceModule`: its `Event.record(stream)`
records on the simulator stream it is given, or on the current one, as CUDA does, so an event SGLang
records on the wrong stream is recorded there, and the tracker sees it.

The runtime context: a server publishes its configuration namespaces at start (`memory`, `model`, the
parallel widths); `published_namespaces` publishes the few leaves the driven code reads, with the values
of a single-GPU server, and `sglang_config` sets the case's switches through SGLang's own override
objects.
"""

from __future__ import annotations

import contextlib
import os
import sys
import types
from typing import Iterator, Optional

import torch

from harness.case import Case
from harness.device.base import Device, Event, Stream
from harness.errors import EnvironmentBroken

SIM_BACKEND = "streamsim"  # torch's device-string parser takes letters only
CP_SIZE = 2  # the CP width the harness models when a case turns CP on

# Leaves of the namespaces a server publishes that the driven code reads, with a single-GPU server's values.
_NAMESPACES = {
    "memory": {"enable_hierarchical_cache": False, "hicache_storage_backend": None, "enable_lmcache": False},
    "model": {"shared_experts": None},
}
_PARALLEL = {"num_dp_ranks": 1, "attn_dcp_size": 1, "pp_size": 1, "attn_cp_size": CP_SIZE}


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

    def synchronize(self) -> None:
        self.device.synchronize()


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

    def current_stream(self, device=None) -> SimStream:
        device = self.bound_device()
        return SimStream(device, device.current_stream)

    @contextlib.contextmanager
    def StreamContext(self, stream: SimStream) -> Iterator[None]:  # noqa: N802 - torch's name
        with stream.device.stream(stream.stream):
            yield

    def synchronize(self, device=None) -> None:
        self.bound_device().synchronize()

    @staticmethod
    def is_available() -> bool:
        return True


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


# -- CUDA: real events, seen through torch's GPU trace ------------------------------------------------------

_TORCH_DIR = os.path.dirname(torch.__file__)
_SGLANG_MARK = f"{os.sep}sglang{os.sep}"


def _issued_by_sglang() -> bool:
    """Whether the first frame above torch's own (the code that called torch) is SGLang's."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(_TORCH_DIR):
        frame = frame.f_back
    return frame is not None and _SGLANG_MARK in frame.f_code.co_filename


class CudaEventBridge:
    """Real `torch.cuda.Event`s and stream waits of SGLang's code, placed in the happens-before tracker.

    torch's GPU trace calls back on every event record and wait with (event, stream) handles. A record
    that SGLang's code issues (directly, or through torch's `Stream.wait_stream`) gets a harness event id
    and is recorded on the harness stream with that handle, or on a stream of its own when SGLang recorded
    it on a stream the harness does not own (then it orders nothing); SGLang's waits on such an event are
    fed to the tracker as waits of the stream they were issued on. The harness's own records and waits
    feed the tracker themselves and are left alone here."""

    _active: Optional["CudaEventBridge"] = None
    _installed = False

    def __init__(self, device: Device):
        self.device = device
        self.events: dict[int, tuple[Event, Stream]] = {}
        self.foreign: dict[int, Stream] = {}
        self.pending_delay = False

    @classmethod
    def _install(cls) -> None:
        if cls._installed:
            return
        torch._C._activate_gpu_trace()
        torch.cuda._gpu_trace.register_callback_for_event_record(cls._on_record)
        torch.cuda._gpu_trace.register_callback_for_event_wait(cls._on_wait)
        cls._installed = True

    @classmethod
    def _on_record(cls, event_handle: int, stream_handle: int) -> None:
        bridge = cls._active
        if bridge is not None and _issued_by_sglang():
            bridge.recorded(event_handle, stream_handle)

    @classmethod
    def _on_wait(cls, event_handle: int, stream_handle: int) -> None:
        bridge = cls._active
        if bridge is not None and event_handle in bridge.events and _issued_by_sglang():
            event, _ = bridge.events[event_handle]
            bridge.device.tracker.wait(bridge.stream_of(stream_handle).id, event.id)

    @contextlib.contextmanager
    def bound(self) -> Iterator[None]:
        self._install()
        saved, CudaEventBridge._active = CudaEventBridge._active, self
        try:
            yield
        finally:
            CudaEventBridge._active = saved

    def stream_of(self, handle: int) -> Stream:
        """The harness stream with this CUDA handle, or a stream of its own for one the harness does not own."""
        for stream in (self.device.forward_stream, self.device.schedule_stream):
            if self.device.native(stream).cuda_stream == handle:
                return stream
        if handle not in self.foreign:
            self.foreign[handle] = self.device.new_stream(f"sglang-{handle:x}")
        return self.foreign[handle]

    def recorded(self, event_handle: int, stream_handle: int) -> None:
        stream = self.stream_of(stream_handle)
        event = Event(self.device._new_event_id())
        self.device.tracker.record(event.id, stream.id)
        self.events[event_handle] = (event, stream)
        self.pending_delay = stream is self.device.forward_stream

    def where_recorded(self, native) -> Optional[tuple[Event, Stream]]:
        return self.events.get(getattr(native, "cuda_event", None))


# -- the runtime context and the case's switches -------------------------------------------------------

def published_namespaces(api) -> None:
    """Publish the configuration namespaces a server would have published at start (each once)."""
    runtime = api.mods["runtime"]
    ctx = runtime.get_context()
    for name, leaves in _NAMESPACES.items():
        if ctx.is_config_namespace_published(name):
            continue
        bag = runtime._ConfigBag(name)
        for leaf, value in leaves.items():
            bag._set(leaf, value)
        ctx._config_bags = {**(ctx._config_bags or {}), name: bag}


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


class _ActiveCP:
    """A CP strategy that applies to every CP-capable batch: the harness's `cp_active` flag. The model owns
    the CP row layout (SGLang's CP-TP group sharing), so the runner's CP metadata is only its rank split."""

    kind = "harness-cp-active"
    cp_size = CP_SIZE

    def can_apply(self, num_tokens, forward_batch) -> bool:
        return forward_batch.forward_mode.is_context_parallel_extend()

    def build_metadata(self, num_tokens: int, seqs_len, extend_seqs_len=None):
        half = -(-num_tokens // self.cp_size)
        return types.SimpleNamespace(per_rank_actual_token=[half, num_tokens - half])


@contextlib.contextmanager
def sglang_config(api, case: Case) -> Iterator[None]:
    """The case's switches, set through SGLang's own configuration objects, for the host-side calls."""
    flags, envs = case.flags, api.mods["environ"].envs
    published_namespaces(api)
    runtime, cp_base = api.mods["runtime"], api.mods["cp_base"]
    saved_cp = cp_base._STRATEGY
    with contextlib.ExitStack() as stack:
        stack.enter_context(_scoped_env(envs.SGLANG_ENABLE_PREFILL_WAR_READ_DONE, flags.SGLANG_ENABLE_PREFILL_WAR_READ_DONE))
        stack.enter_context(envs.SGLANG_FORCE_COARSE_WAR_BARRIER.override(flags.SGLANG_FORCE_COARSE_WAR_BARRIER))
        stack.enter_context(envs.SGLANG_OPT_FLASHMLA_SPARSE_PREFILL.override(flags.SGLANG_OPT_FLASHMLA_SPARSE_PREFILL))
        stack.enter_context(runtime.get_memory().override(
            enable_hierarchical_cache=flags.hierarchical_cache,
            hicache_storage_backend="file" if flags.hicache_storage else None, enable_lmcache=flags.lmcache))
        stack.enter_context(runtime.get_parallel().override(**_PARALLEL, enable_cp_tp_group_sharing=flags.cp_active))
        cp_base._STRATEGY = _ActiveCP() if flags.cp_active else None
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
