"""Happens-before race tracking for streams, events, host syncs and CUDA-graph replays.

Modelled on PyTorch's CUDA sanitizer (``torch/cuda/_sanitizer.py``): every stream carries
a vector clock of global launch sequence numbers, an event snapshots the clock of the
stream it was recorded on, and an earlier access is ordered before a later one exactly
when the later stream's clock has reached the earlier access's sequence number.

Beyond CSAN, an access names a *region* of a buffer rather than a base pointer, kernels
launched outside torch's dispatcher declare their reads and writes explicitly, and a
captured CUDA graph can be replayed into the tracker with its internal record/wait edges.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import count
from types import MappingProxyType
from typing import Literal, Mapping, Optional

StreamId = int
EventId = int
SeqNum = int
Buffer = str
Region = Optional[frozenset[int]]
"""Element/row indices of a buffer; ``None`` is the whole buffer."""
VectorClock = dict[StreamId, SeqNum]
"""For each stream, the sequence number of its latest launch known to have completed."""

_NO_ACCESSES: Mapping[Buffer, Region] = MappingProxyType({})
_SHOWN_INDICES = 4


def overlaps(a: Region, b: Region) -> bool:
    """Whether two regions of one buffer share an element."""
    return a is None or b is None or not a.isdisjoint(b)


def _covers(outer: Region, inner: Region) -> bool:
    return outer is None or (inner is not None and inner <= outer)


def _overlap(a: Region, b: Region) -> Region:
    if a is None:
        return b
    if b is None:
        return a
    return a & b


def _describe_region(region: Region) -> str:
    if region is None:
        return "whole buffer"
    shown = ", ".join(str(i) for i in sorted(region)[:_SHOWN_INDICES])
    more = f", ... ({len(region)} in all)" if len(region) > _SHOWN_INDICES else ""
    return f"indices {{{shown}{more}}}"


def _merge(into: VectorClock, other: Mapping[StreamId, SeqNum]) -> None:
    """Pointwise max: ``into`` learns everything ``other`` knows has completed."""
    for stream, seq in other.items():
        if into.get(stream, 0) < seq:
            into[stream] = seq


@dataclass(frozen=True)
class Access:
    """One operation's read or write of part of a buffer, placed in happens-before order by
    its (stream, seq); ``graph`` says which replayed graph it came from, since a graph's
    nodes are otherwise invisible in a trace."""

    stream: StreamId
    seq: SeqNum
    op: str
    buffer: Buffer
    region: Region
    is_write: bool
    graph: Optional[str] = None

    @property
    def kind(self) -> str:
        return "write" if self.is_write else "read"

    def _describe(self) -> str:
        where = f"stream {self.stream}" if self.stream >= 0 else f"graph-local stream {self.stream}"
        origin = f", graph {self.graph!r}" if self.graph is not None else ""
        return f"{self.kind} by {self.op!r} on {where} (seq {self.seq}{origin})"


@dataclass(frozen=True)
class Conflict:
    """An unordered pair of accesses to overlapping parts of one buffer, at least one a write."""

    earlier: Access
    later: Access

    def __str__(self) -> str:
        overlap = _describe_region(_overlap(self.earlier.region, self.later.region))
        return (
            f"race on {self.earlier.buffer!r} ({overlap}):\n"
            f"  {self.earlier._describe()} is not ordered before {self.later._describe()}"
        )


@dataclass(frozen=True)
class GraphNode:
    """One operation captured into a CUDA graph. ``stream`` is a capture-local index (0 is the
    stream the graph is replayed on) because a replay runs on streams chosen at replay time."""

    kind: Literal["launch", "record", "wait"]
    stream: int = 0
    op: str = ""
    reads: tuple[tuple[Buffer, Region], ...] = ()
    writes: tuple[tuple[Buffer, Region], ...] = ()
    event: Optional[EventId] = None

    def __post_init__(self) -> None:
        if (self.kind == "launch") != (self.event is None):
            raise ValueError(f"{self.kind} node {self.op!r}: an event belongs on record/wait nodes only")
        for accesses in (self.reads, self.writes):
            buffers = [buffer for buffer, _ in accesses]
            if len(set(buffers)) != len(buffers):
                raise ValueError(f"node {self.op!r} lists a buffer twice; give it one region")


@dataclass
class CapturedGraph:
    """The nodes of one capture, in capture order (a valid execution order of the graph)."""

    name: str
    nodes: list[GraphNode]


class HappensBefore:
    """Happens-before state of one run: stream clocks, event snapshots, the host's sync state
    and, per buffer, the accesses a future access could still race with.

    An earlier access is dropped once a later access on the same buffer is ordered after it,
    covers its region and is at least as strong (a write, or a read replacing a read): any
    future access racing with the dropped one then races with its replacement too, so every
    racy access still gets reported, while well-synchronised programs keep short lists.
    """

    def __init__(self) -> None:
        self._seqs = count(1)
        self._virtual_streams = count(-1, -1)
        self._streams: dict[StreamId, VectorClock] = {}
        self._events: dict[EventId, VectorClock] = {}
        self._host: VectorClock = {}
        self._live: dict[Buffer, list[Access]] = {}
        self._conflicts: list[Conflict] = []

    @property
    def conflicts(self) -> list[Conflict]:
        return list(self._conflicts)

    def _clock(self, stream: StreamId) -> VectorClock:
        """The stream's clock; a stream first seen now starts from the host's sync state."""
        clock = self._streams.get(stream)
        if clock is None:
            clock = self._streams[stream] = dict(self._host)
        return clock

    def launch(
        self,
        stream: StreamId,
        op: str,
        reads: Mapping[Buffer, Region] = _NO_ACCESSES,
        writes: Mapping[Buffer, Region] = _NO_ACCESSES,
        *,
        graph: Optional[str] = None,
    ) -> list[Conflict]:
        seq = next(self._seqs)
        clock = self._clock(stream)
        clock[stream] = seq
        # Writes first, so an op that reads and writes one buffer is reported by its write.
        accesses = [Access(stream, seq, op, b, r, True, graph) for b, r in writes.items()]
        accesses += [Access(stream, seq, op, b, r, False, graph) for b, r in reads.items()]

        found: list[Conflict] = []
        reported: set[tuple[SeqNum, Buffer]] = set()
        for access in accesses:
            for prior in self._live.get(access.buffer, ()):
                if (
                    (access.is_write or prior.is_write)
                    and overlaps(prior.region, access.region)
                    and clock.get(prior.stream, 0) < prior.seq
                    and (prior.seq, access.buffer) not in reported
                ):
                    reported.add((prior.seq, access.buffer))
                    found.append(Conflict(prior, access))

        for access in accesses:
            live = self._live.setdefault(access.buffer, [])
            live[:] = [prior for prior in live if not self._replaces(access, prior, clock)]
            live.append(access)

        self._conflicts.extend(found)
        return found

    @staticmethod
    def _replaces(access: Access, prior: Access, clock: VectorClock) -> bool:
        return (
            prior.seq < access.seq
            and clock.get(prior.stream, 0) >= prior.seq
            and _covers(access.region, prior.region)
            and (access.is_write or not prior.is_write)
        )

    def record(self, event: EventId, stream: StreamId) -> None:
        self._events[event] = dict(self._clock(stream))

    def wait(self, stream: StreamId, event: EventId) -> None:
        clock = self._clock(stream)
        snapshot = self._events.get(event)
        if snapshot is not None:
            _merge(clock, snapshot)

    def wait_stream(self, waiter: StreamId, waitee: StreamId) -> None:
        _merge(self._clock(waiter), self._clock(waitee))

    def sync_stream(self, stream: StreamId) -> None:
        self._host_waits_for(self._clock(stream))

    def sync_event(self, event: EventId) -> None:
        snapshot = self._events.get(event)
        if snapshot is not None:
            self._host_waits_for(snapshot)

    def sync_device(self) -> None:
        self._host_waits_for(*self._streams.values())

    def _host_waits_for(self, *clocks: VectorClock) -> None:
        """The host has seen the work in ``clocks`` finish, so everything it issues from now
        on, on existing or future streams, is ordered after that work."""
        for clock in clocks:
            _merge(self._host, clock)
        for clock in self._streams.values():
            _merge(clock, self._host)

    def replay(self, graph: CapturedGraph, stream: StreamId) -> list[Conflict]:
        """Feed one replay of ``graph`` on ``stream`` into the tracker.

        Capture-local streams other than 0 become fresh virtual streams (negative ids) that
        fork from ``stream`` at replay start and join back into it at the end, as a graph
        launch does; record and wait nodes act on the tracker's events, so an event recorded
        inside the graph can order work on other streams after the replay."""
        fork = dict(self._clock(stream))
        streams: dict[int, StreamId] = {0: stream}
        found: list[Conflict] = []
        for node in graph.nodes:
            if node.stream not in streams:
                streams[node.stream] = next(self._virtual_streams)
                self._streams[streams[node.stream]] = dict(fork)
            on = streams[node.stream]
            if node.kind == "launch":
                found += self.launch(on, node.op, dict(node.reads), dict(node.writes), graph=graph.name)
            elif node.kind == "record":
                assert node.event is not None
                self.record(node.event, on)
            else:
                assert node.event is not None
                self.wait(on, node.event)

        joined = self._streams[stream]
        for virtual in streams.values():
            if virtual != stream:
                _merge(joined, self._streams.pop(virtual))
        return found
