"""Real CUDA streams and events; operations run as they are issued."""

from __future__ import annotations

import contextlib
import gc
import time
import warnings
from typing import Callable, Iterator, Optional

import torch

from harness.device import gates
from harness.device.base import Device, Event, GraphCapture, Stream
from harness.device.kind import DeviceKind

GATE_POLL_S = 50e-6  # how often `open_gates` looks at the other streams' progress

# torch's stream class, as imported: a target's adapter may stand in for `torch.cuda.Stream` while the target
# runs (the sglang target's event bridge), and the device's own streams must stay plain CUDA streams.
_NATIVE_STREAM = torch.cuda.Stream


class CudaDevice(Device):
    kind = DeviceKind.CUDA
    capture_runs_closures = True
    sleep_cycles_per_ms: Optional[float] = None  # measured once per process: the clock `_sleep` counts

    def __init__(self, *, observe: bool = False) -> None:
        self._streams: dict[int, torch.cuda.Stream] = {}
        self._ids_by_native: dict[int, int] = {}
        self._gates: list[gates.Gate] = []  # this run's race gates, in issue order
        self._gate_wait_s = 0.0  # host seconds spent holding gates open for the scheduler's work to land
        self._processing_mark: Optional[tuple[torch.cuda.Event, torch.cuda.Event]] = None
        super().__init__(observe)
        self._warm_up()

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cuda")

    def new_stream(self, name: str) -> Stream:
        stream = super().new_stream(name)
        self._streams[stream.id] = native = _NATIVE_STREAM()
        self._ids_by_native[native.cuda_stream] = stream.id
        return stream

    def observed_stream_id(self) -> int:
        """The real current CUDA stream: a target may switch streams itself; one the device did not
        create gets an id of its own the first time an op runs on it."""
        return self._stream_of_native(torch.cuda.current_stream().cuda_stream)

    @contextlib.contextmanager
    def stream(self, stream: Stream) -> Iterator[Stream]:
        """Also torch's current stream: tensors the target allocates belong to the stream that uses them."""
        with super().stream(stream), torch.cuda.stream(self._streams[stream.id]):
            yield stream

    @contextlib.contextmanager
    def observing(self) -> Iterator[None]:
        """Also the events a target records and waits on itself, and its host synchronisations: they
        reach the tracker on the real streams they ran on (`_synchronisations_observed`)."""
        if self.observer is None:
            yield
            return
        with _synchronisations_observed(self), super().observing():
            yield

    def _stream_of_native(self, native: int) -> int:
        known = self._ids_by_native.get(native)
        if known is None:
            known = self._ids_by_native[native] = Device.new_stream(self, f"torch-{native:#x}").id
        return known

    def native(self, stream: Stream) -> torch.cuda.Stream:
        return self._streams[stream.id]

    def _issue(self, stream: Stream, op: str, fn: Callable[[], None]) -> None:
        with torch.cuda.stream(self._streams[stream.id]):
            fn()

    def _record(self, event: Event, stream: Stream) -> None:
        native = torch.cuda.Event()
        native.record(self._streams[stream.id])
        event.native = native

    def _wait(self, stream: Stream, event: Event) -> None:
        if event.native is not None:
            self._streams[stream.id].wait_event(event.native)

    def _synchronize(self) -> None:
        self.open_gates()
        torch.cuda.synchronize()

    # -- real CUDA graphs ------------------------------------------------------------------------

    @contextlib.contextmanager
    def capture(self, name: str) -> Iterator[GraphCapture]:
        """A real `torch.cuda.CUDAGraph`: each launch inside records its kernels, which read their
        tensors by address at every replay. Captured on a side stream, without the device-wide
        synchronize of `torch.cuda.graph`, so a capture does not close the race window it sits in."""
        graph = torch.cuda.CUDAGraph()
        side = _NATIVE_STREAM()
        side.wait_stream(torch.cuda.current_stream())
        collecting = gc.isenabled()
        gc.disable()  # a collected graph of an earlier case would free its pool mid-capture and void it
        try:
            with super().capture(name) as captured, torch.cuda.stream(side):
                captured.native = graph
                graph.capture_begin(capture_error_mode="thread_local")
                try:
                    yield captured
                finally:
                    with warnings.catch_warnings():  # a layer with nothing to store captures an empty graph
                        warnings.filterwarnings("ignore", message="The CUDA Graph is empty")
                        graph.capture_end()
        finally:
            if collecting:
                gc.enable()
        torch.cuda.current_stream().wait_stream(side)

    def _captured(self, fn: Callable[[], None]) -> Optional[Callable[[], None]]:
        fn()  # recorded into the graph being captured, not executed
        return None

    def _replay(self, graph: GraphCapture, records) -> None:
        """The replayed kernels bypass the dispatcher: their accesses are the nodes' (declared and
        observed at capture), already given to the tracker."""
        for record in records:
            self.tracker.close_launch(record)
        with torch.cuda.stream(self._streams[self.current_stream.id]):
            graph.native.replay()

    def delay(self, cycles: int) -> None:
        """A race gate (`harness.device.gates`) on the current stream, opened by `open_gates` or at
        the latest after as long as `cycles` of `torch.cuda._sleep` would take."""
        if cycles:
            self.delays.append(cycles)
            stream = self.current_stream
            seq = self.tracker.mark(stream.id)
            gate = gates.hold(gates.gate_word(), self._streams[stream.id], stream.id, seq,
                              self.cycles_to_ms(cycles) / 1e3)
            self._gates.append(gate)

    def open_gates(self) -> None:
        """Opens the held gates in issue order, each once every other stream's work issued so far
        has run, or what is still running is ordered after the held stream's work beyond the gate
        (the tracker's clocks: it would wait for the gate forever). Called when the host is done
        issuing, and before any host synchronisation, which would otherwise wait for the deadline."""
        pending = [gate for gate in self._gates if gate.opened_by is None]
        if not pending:
            return
        began = time.perf_counter()
        word = gates.gate_word()
        probes = {}
        for stream_id, native in self._streams.items():
            probe = torch.cuda.Event()
            torch._C._CudaEventBase.record(probe, native)  # the harness's own: not a target's event to track
            probes[stream_id] = probe
        for gate in pending:
            others = [probe_id for probe_id in probes if probe_id != gate.stream_id]
            while True:
                gate.opened_by = gates.opening(
                    leaked=gates.leaked(gate, word), timed_out=word.is_open(gate.number),
                    running=[probe_id for probe_id in others if not probes[probe_id].query()],
                    awaits_gate=lambda probe_id: self.tracker.reached(probe_id, gate.stream_id, gate.seq))
                if gate.opened_by is not None:
                    break
                time.sleep(GATE_POLL_S)
            word.open(gate.number)
            gate.timer.cancel()
            gate.held_s = time.perf_counter() - gate.issued_at
        self._gate_wait_s += time.perf_counter() - began

    def race_delay_seconds(self) -> float:
        return self._gate_wait_s

    def race_window(self) -> dict:
        """Also each gate's hold: open means no gate was opened by its deadline or leaked, so every
        one held its stream until the scheduler's issued work had run or was waiting for it."""
        window = super().race_window()
        held = [gate for gate in self._gates if gate.opened_by is not None]
        window["gates"] = [{"held_ms": gate.held_s * 1e3, "opened_by": gate.opened_by} for gate in held]
        if held:
            window["open"] = all(gate.opened_by in ("landed", "awaited") for gate in held)
        return window

    def mark_processing(self) -> None:
        """Two timing events, recorded past torch's `Event.record` (the harness's own: not a target's event for
        the tracker): one at the forward stream's tail, one on the scheduler's stream."""
        if self._processing_mark is not None:
            return  # the first start on the result is the one that overlaps
        forward_end, scheduler_start = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch._C._CudaEventBase.record(forward_end, self._streams[self.forward_stream.id])
        torch._C._CudaEventBase.record(scheduler_start, self._streams[self.current_stream.id])
        self._processing_mark = (forward_end, scheduler_start)

    def take_overlap_ms(self) -> Optional[float]:
        mark, self._processing_mark = self._processing_mark, None
        if mark is None:
            return None
        forward_end, scheduler_start = mark
        return scheduler_start.elapsed_time(forward_end)

    def _warm_up(self) -> None:
        """The first trial in a fresh process does not race (stream start-up): warm both streams,
        and load the kernels a graph capture records, since a capture cannot load modules lazily."""
        for native in self._streams.values():
            with torch.cuda.stream(native):
                torch.cuda._sleep(1000)
                table = torch.zeros(4, 2, device="cuda")
                table.index_copy_(0, torch.arange(4, device="cuda").clamp(min=0), torch.ones(4, 2, device="cuda"))
        torch.cuda.synchronize()
        if CudaDevice.sleep_cycles_per_ms is None:
            CudaDevice.sleep_cycles_per_ms = _calibrate_sleep()

    def cycles_to_ms(self, cycles: int) -> Optional[float]:
        return cycles / self.sleep_cycles_per_ms


_OBSERVING: Optional[CudaDevice] = None  # the device whose tracker torch's events and syncs feed now


@contextlib.contextmanager
def _synchronisations_observed(device: CudaDevice) -> Iterator[None]:
    """torch's `Event.record` / `wait` / `synchronize`, `Stream.synchronize` and `torch.cuda.synchronize`
    also tell the observing device's tracker, as CSAN's GPU trace callbacks do (`Stream.wait_event`,
    `wait_stream` and `record_event` go through the event's methods). Wrapped only while a device
    observes, and not through torch's GPU trace: once on, that calls into Python at every allocation
    for the rest of the process, also while an exception unwinds, which on the H200 replaced a target's
    own error with a SystemError. A native event's handle is its id in the tracker (the device's own
    events have small ids of their own). Code that bound `torch.cuda.synchronize` to a name of its own
    before the run is not seen."""
    global _OBSERVING
    if _OBSERVING is not None:  # nested: the wrappers are in place
        previous, _OBSERVING = _OBSERVING, device
        try:
            yield
        finally:
            _OBSERVING = previous
        return
    event_cls, stream_cls = torch.cuda.Event, torch.cuda.Stream
    record, wait, event_sync = event_cls.record, event_cls.wait, event_cls.synchronize
    stream_sync, device_sync = stream_cls.synchronize, torch.cuda.synchronize

    def stream_id(stream) -> int:
        return _OBSERVING._stream_of_native((stream if stream is not None else torch.cuda.current_stream()).cuda_stream)

    def observed_record(event, stream=None):
        record(event, stream)
        _OBSERVING.tracker.record(event.cuda_event, stream_id(stream))

    def observed_wait(event, stream=None):
        wait(event, stream)
        _OBSERVING.tracker.wait(stream_id(stream), event.cuda_event)

    def observed_event_sync(event):
        _OBSERVING.open_gates()
        event_sync(event)
        _OBSERVING.tracker.sync_event(event.cuda_event)

    def observed_stream_sync(stream):
        _OBSERVING.open_gates()
        stream_sync(stream)
        _OBSERVING.tracker.sync_stream(stream_id(stream))

    def observed_device_sync(device_index=None):
        _OBSERVING.open_gates()
        device_sync(device_index)
        _OBSERVING.tracker.sync_device()

    _OBSERVING = device
    event_cls.record, event_cls.wait, event_cls.synchronize = observed_record, observed_wait, observed_event_sync
    stream_cls.synchronize, torch.cuda.synchronize = observed_stream_sync, observed_device_sync
    try:
        yield
    finally:
        event_cls.record, event_cls.wait, event_cls.synchronize = record, wait, event_sync
        stream_cls.synchronize, torch.cuda.synchronize = stream_sync, device_sync
        _OBSERVING = None


def _calibrate_sleep(cycles: int = 20_000_000, repeats: int = 3) -> float:
    """Cycles of `torch.cuda._sleep` per millisecond on this GPU at its current clock (best of a few)."""
    best = None
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        stop.record()
        stop.synchronize()
        ms = start.elapsed_time(stop)
        best = ms if best is None else min(best, ms)
    return cycles / best
