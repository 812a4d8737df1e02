"""The device interface the system under test issues its work through."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping, Optional, Sequence

from harness.device.kind import DeviceKind
from harness.hb import CapturedGraph, GraphNode, HappensBefore, LaunchRecord, Region
from harness.observe import Observer

Accesses = Mapping[str, Region]


@dataclass(frozen=True)
class Stream:
    """A named stream; `id` is what the happens-before tracker sees."""

    name: str
    id: int


@dataclass
class Event:
    id: int
    native: object = None  # torch.cuda.Event on CUDA, the record's queue position on the simulator


class OpFailed(RuntimeError):
    """An operation raised while it executed (for example an index read through a poisoned table)."""

    def __init__(self, op: str, stream: str, error: BaseException):
        super().__init__(f"{op} on stream {stream} raised {type(error).__name__}: {error}")
        self.op = op
        self.stream = stream
        self.error = error


@dataclass
class GraphCapture:
    """Operations captured once and replayed: the closures keep the tensors they were captured with."""

    name: str
    nodes: list[GraphNode] = field(default_factory=list)
    fns: list[Optional[Callable[[], None]]] = field(default_factory=list)
    native: object = None  # the torch.cuda.CUDAGraph on CUDA; None where replay re-runs the closures

    def as_hb(self) -> CapturedGraph:
        return CapturedGraph(self.name, list(self.nodes))


class Device:
    """Base class: stream bookkeeping, the tracker, and graph capture shared by both devices.

    `observe=True` adds the observer (`harness/observe/`): what each launched closure really reads
    and writes, and what the host runs outside any launch, is fed to the tracker beside the
    declarations, within `observing()`."""

    kind: DeviceKind  # each device its own
    capture_runs_closures = False  # a real capture runs each closure once, recording its kernels
    decisions: Sequence = ()  # the simulator's choices of which stream runs next; a real device makes none

    def __init__(self, observe: bool = False) -> None:
        self.tracker = HappensBefore()
        self.observer: Optional[Observer] = Observer(self.tracker, self.observed_stream_id) if observe else None
        self._next_id = 0
        self.forward_stream = self.new_stream("forward")
        self.schedule_stream = self.new_stream("schedule")
        self.current_stream = self.forward_stream
        self._capturing: Optional[GraphCapture] = None
        self.delays: list[int] = []
        self.race_delay = 0  # cycles the forward stream is held at most right after recording an event
        self._recorded_at: Optional[float] = None
        self.issue_gaps: list[float] = []  # host seconds from a forward-stream event to the next scheduler launch

    def forced_string(self) -> Optional[str]:
        """The order this run's streams ran in, replayable as ``--schedule forced:<this>``; None where
        the device does not choose the order (CUDA runs what it is given as the hardware schedules it)."""
        return None

    # -- streams and events ------------------------------------------------------------------

    def new_stream(self, name: str) -> Stream:
        self._next_id += 1
        return Stream(name, 1000 + self._next_id)

    def new_event_id(self) -> int:
        """A fresh id for an event of this device (the tracker's key; the sglang target's event bridge
        takes one for each event SGLang's code records)."""
        self._next_id += 1
        return 2000 + self._next_id

    @contextlib.contextmanager
    def stream(self, stream: Stream) -> Iterator[Stream]:
        previous, self.current_stream = self.current_stream, stream
        try:
            yield stream
        finally:
            self.current_stream = previous

    def observed_stream_id(self) -> int:
        """The stream an op the host runs outside any launch goes to."""
        return self.current_stream.id

    def observing(self) -> contextlib.AbstractContextManager:
        """The block's torch ops and Triton launches are observed (a no-op without the observer)."""
        return self.observer.observing() if self.observer is not None else contextlib.nullcontext()

    def launch(self, op: str, fn: Callable[[], None], reads: Accesses = {}, writes: Accesses = {}) -> None:
        """Issue one operation on the current stream, or capture it if a capture is open."""
        if self._capturing is not None:
            self._capture_launch(op, fn, reads, writes)
            return
        if self._recorded_at is not None and self.current_stream is self.schedule_stream:
            self.issue_gaps.append(time.perf_counter() - self._recorded_at)
            self._recorded_at = None
        if self.observer is None:
            self.tracker.launch(self.current_stream.id, op, reads, writes)
            self._issue(self.current_stream, op, fn)
            return
        record = self.tracker.open_launch(self.current_stream.id, op, reads, writes)
        self._issue(self.current_stream, op, self.observer.attributed(record, fn))

    def _capture_launch(self, op: str, fn: Callable[[], None], reads: Accesses, writes: Accesses) -> None:
        """A node of the open capture. Where the capture runs the closure (CUDA), what it is observed
        to touch joins the node's accesses, so every replay carries it; the simulator's replays
        re-run the closure and are observed then."""
        assert self._capturing is not None
        node_reads, node_writes = dict(reads), dict(writes)
        if self.observer is not None and self.capture_runs_closures:
            fn = self.observer.collecting(op, reads, writes, fn, (node_reads, node_writes))
        replayed = self._captured(fn)
        self._capturing.nodes.append(GraphNode("launch", 0, op, tuple(node_reads.items()), tuple(node_writes.items())))
        self._capturing.fns.append(replayed)

    @contextlib.contextmanager
    def host_work(self, op: str, reads: Accesses = {}, writes: Accesses = {}) -> Iterator[None]:
        """Code of the system under test that works on tensors eagerly from the host (not a launched
        closure), as one operation on the current stream: after everything issued to that stream before
        it, as CUDA orders a stream's work, and recorded in the tracker with its accesses."""
        if self._capturing is not None:
            raise RuntimeError(f"{op}: host work inside a graph capture is not modelled")
        if self.observer is None:
            self.tracker.launch(self.current_stream.id, op, reads, writes)
            self._catch_up(self.current_stream)
            yield
            return
        record = self.tracker.open_launch(self.current_stream.id, op, reads, writes)
        self._catch_up(self.current_stream)
        with self.observer.attributing(record):  # what it touches is checked against what it declared
            yield

    def _catch_up(self, stream: Stream) -> None:
        """Run what `stream` was given so far (the simulator); a real device orders it by itself."""

    def record_event(self, stream: Optional[Stream] = None) -> Event:
        stream = stream or self.current_stream
        if self._capturing is not None:
            raise RuntimeError("recording an event inside a graph capture is not modelled; record it before replay")
        event = Event(self.new_event_id())
        self.tracker.record(event.id, stream.id)
        self._record(event, stream)
        if stream is self.forward_stream:
            self._recorded_at = time.perf_counter()
            if self.race_delay:
                with self.stream(stream):
                    self.delay(self.race_delay)  # so that a read after the event really loses the race
        return event

    def race_window(self) -> dict:
        """How wide the injected race window was, against how long the host took to issue the
        scheduler's first mutation after the event: the window is real only if it is the wider."""
        delay_ms = self.cycles_to_ms(self.race_delay)
        gap_ms = max(self.issue_gaps) * 1e3 if self.issue_gaps else None
        return {"delay_cycles": self.race_delay, "delay_ms": delay_ms, "issue_gap_ms": gap_ms,
                "open": None if delay_ms is None or gap_ms is None else delay_ms > gap_ms}

    def cycles_to_ms(self, cycles: int) -> Optional[float]:
        """Only a real device has a clock to calibrate; the simulator's delay is an ordering, not a time."""
        return None

    def mark_processing(self) -> None:
        """The scheduler starts on a batch's result here (the engine's `process`, on the scheduler's stream, after
        its barrier): a device with a clock notes when its stream reaches this point and when the forward stream
        reaches the end of what it was given so far (the whole forward), for `take_overlap_ms`. The simulator
        has no clock."""

    def take_overlap_ms(self) -> Optional[float]:
        """How many milliseconds before the forward's end the scheduler's stream started on the batch's result
        (negative: after it), from the batch's first `mark_processing`, once the batch has synchronized; None
        where the device has no clock or the scheduler never started."""
        return None

    def race_delay_seconds(self) -> float:
        """Host seconds this run spent holding race windows open (CUDA's gates); none on the simulator."""
        return 0.0

    def wait_event(self, stream: Stream, event: Event) -> None:
        self.tracker.wait(stream.id, event.id)
        self._wait(stream, event)

    def wait_stream(self, waiter: Stream, waitee: Stream) -> None:
        self.tracker.wait_stream(waiter.id, waitee.id)
        event = Event(self.new_event_id())
        self._record(event, waitee)
        self._wait(waiter, event)

    def synchronize(self) -> None:
        self._synchronize()
        self.tracker.sync_device()

    # -- graphs ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def capture(self, name: str) -> Iterator[GraphCapture]:
        if self._capturing is not None:
            raise RuntimeError("nested graph capture")
        graph = GraphCapture(name)
        self._capturing = graph
        try:
            yield graph
        finally:
            self._capturing = None

    def replay(self, graph: GraphCapture) -> None:
        """The tracker receives every captured access and edge of this replay (CSAN sees none)."""
        records = self.tracker.replay_launches(graph.as_hb(), self.current_stream.id)
        self._replay(graph, records)

    def _replay(self, graph: GraphCapture, records: list[LaunchRecord]) -> None:
        """Re-run the captured closures in capture order on the current stream, each observed as its
        node's launch."""
        for node, fn, record in zip(graph.nodes, graph.fns, records):
            if self.observer is None:
                self.tracker.close_launch(record)
            else:
                fn = self.observer.attributed(record, fn)
            self._issue(self.current_stream, f"{graph.name}/{node.op}", fn)

    def _captured(self, fn: Callable[[], None]) -> Optional[Callable[[], None]]:
        """What a replay re-runs of one captured operation: here the closure itself."""
        return fn

    # -- what each device implements -----------------------------------------------------------

    def _issue(self, stream: Stream, op: str, fn: Callable[[], None]) -> None:
        raise NotImplementedError

    def _record(self, event: Event, stream: Stream) -> None:
        raise NotImplementedError

    def _wait(self, stream: Stream, event: Event) -> None:
        raise NotImplementedError

    def _synchronize(self) -> None:
        raise NotImplementedError

    def delay(self, cycles: int) -> None:
        """Hold the current stream (CUDA: a race gate, at most as long as `cycles` of `_sleep`) so that
        a late read really loses the race."""

    @property
    def torch_device(self):
        raise NotImplementedError

    def trace(self) -> list[str]:
        """The executed order, as `stream:op` lines."""
        return []
