"""Happens-before race tracking for streams, events, host syncs and CUDA-graph replays.

Modelled on PyTorch's CUDA sanitizer (``torch/cuda/_sanitizer.py``): every stream carries
a vector clock of global launch sequence numbers, an event snapshots the clock of the
stream it was recorded on, and an earlier access is ordered before a later one exactly
when the later stream's clock has reached the earlier access's sequence number.

Beyond CSAN, an access names a *region* of a buffer rather than a base pointer, kernels
launched outside torch's dispatcher declare their reads and writes explicitly, and a
captured CUDA graph can be replayed into the tracker with its internal record/wait edges.

Accesses may arrive after their launch was issued: the observer (``harness/observe/``) sees
what an operation really touched only when it executes, which on the simulator is long after
the host issued it. Each access therefore carries the clock its stream had at issue, so a pair
is judged by the program's order whatever order the accesses arrive in.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import count
from types import MappingProxyType
from typing import Literal, Mapping, Optional, Union

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


def covers(outer: Region, inner: Region) -> bool:
    return outer is None or (inner is not None and inner <= outer)


def _overlap(a: Region, b: Region) -> Region:
    if a is None:
        return b
    if b is None:
        return a
    return a & b


def union(a: Region, b: Region) -> Region:
    return None if a is None or b is None else a | b


_NOT_SEEN = object()


def describe_region(region: Region) -> str:
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
    clock: Mapping[StreamId, SeqNum] = field(default_factory=dict, compare=False, repr=False)
    """The issuing stream's clock at issue: what this access is known to be ordered after."""
    frame: Optional[str] = None
    """Where an observed access came from (``file:line in function``); None for a declared one."""

    @property
    def kind(self) -> str:
        return "write" if self.is_write else "read"

    def ordered_with(self, other: "Access") -> bool:
        """Whether one of the two is known to complete before the other starts."""
        first, second = (self, other) if self.seq < other.seq else (other, self)
        return second.clock.get(first.stream, 0) >= first.seq

    def _describe(self) -> str:
        where = f"stream {self.stream}" if self.stream >= 0 else f"graph-local stream {self.stream}"
        origin = f", graph {self.graph!r}" if self.graph is not None else ""
        frame = f" at {self.frame}" if self.frame else ""
        return f"{self.kind} by {self.op!r} on {where} (seq {self.seq}{origin}){frame}"


@dataclass
class LaunchRecord:
    """One issued operation: its place in the order and what it declared. Observed accesses are
    added to it while it runs (`HappensBefore.observe`); it stays open until it has finished."""

    stream: StreamId
    seq: SeqNum
    op: str
    clock: Mapping[StreamId, SeqNum]
    reads: Mapping[Buffer, Region]
    writes: Mapping[Buffer, Region]
    graph: Optional[str] = None
    conflicts: list["Conflict"] = field(default_factory=list)
    observed: dict[tuple[Buffer, bool], Region] = field(default_factory=dict)


@dataclass(frozen=True)
class Conflict:
    """An unordered pair of accesses to overlapping parts of one buffer, at least one a write."""

    earlier: Access
    later: Access

    def with_frame(self, observed: Access) -> "Conflict":
        """The same pair, where a side that `observed` was seen to make carries its frame."""
        def framed(side: Access) -> Access:
            same = side.seq == observed.seq and side.is_write == observed.is_write and side.frame is None
            return replace(side, frame=observed.frame) if same else side
        return Conflict(framed(self.earlier), framed(self.later))

    def __str__(self) -> str:
        overlap = describe_region(_overlap(self.earlier.region, self.later.region))
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


@dataclass(frozen=True)
class Issued:
    """A launch as it was issued: its stream, its place in the order, the buffers it declared."""

    stream: StreamId
    seq: SeqNum
    op: str
    buffers: frozenset[Buffer]


@dataclass(frozen=True)
class Recorded:
    """An event recorded on a stream, with the clock it copied: what a wait on this record orders after."""

    event: EventId
    stream: StreamId
    clock: Mapping[StreamId, SeqNum]


@dataclass(frozen=True)
class Checkpoint:
    """A point the harness marks in a stream's program (the scheduler starting on a batch's result), with the
    stream's clock there: which work of every other stream that point is ordered after."""

    stream: StreamId
    clock: Mapping[StreamId, SeqNum]


TimelineEntry = Union[Issued, Recorded, Checkpoint]
"""What the tracker saw, in host issue order (`HappensBefore.take_timeline`): where an event sits among the
launches, and how far a stream had waited at a marked point. Conflicts say whether a program is ordered; the
timeline says how tightly (the fast path's question)."""


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
        self._reported: dict[tuple[SeqNum, SeqNum, Buffer], int] = {}  # each pair's place in _conflicts
        self._open: set[SeqNum] = set()
        self._unpruned: set[Buffer] = set()
        self._timeline: list[TimelineEntry] = []

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
        """Issue an operation whose accesses are all declared: judged at once, then closed."""
        record = self.open_launch(stream, op, reads, writes, graph=graph)
        self.close_launch(record)
        return record.conflicts

    def open_launch(
        self,
        stream: StreamId,
        op: str,
        reads: Mapping[Buffer, Region] = _NO_ACCESSES,
        writes: Mapping[Buffer, Region] = _NO_ACCESSES,
        *,
        graph: Optional[str] = None,
    ) -> LaunchRecord:
        """Issue an operation: its declared accesses are judged now; what it is observed to touch
        while it runs is added with `observe` until `close_launch`."""
        seq = next(self._seqs)
        clock = self._clock(stream)
        clock[stream] = seq
        record = LaunchRecord(stream, seq, op, dict(clock), reads, writes, graph)
        self._open.add(seq)
        self._timeline.append(Issued(stream, seq, op, frozenset(reads) | frozenset(writes)))
        # Writes first, so an op that reads and writes one buffer is reported by its write.
        for buffer, region in writes.items():
            record.conflicts += self._add(Access(stream, seq, op, buffer, region, True, graph, record.clock))
        for buffer, region in reads.items():
            record.conflicts += self._add(Access(stream, seq, op, buffer, region, False, graph, record.clock))
        return record

    def observe(self, record: LaunchRecord, buffer: Buffer, region: Region, is_write: bool,
                frame: Optional[str] = None) -> list[Conflict]:
        """An access `record`'s operation was seen to make, judged against every other access to the
        buffer, earlier or later in the program, by the clocks both had at issue."""
        known = record.observed.get((buffer, is_write), _NOT_SEEN)
        if known is not _NOT_SEEN and covers(known, region):
            return []
        record.observed[(buffer, is_write)] = region if known is _NOT_SEEN else union(known, region)
        found = self._add(Access(record.stream, record.seq, record.op, buffer, region, is_write, record.graph,
                                 record.clock, frame))
        record.conflicts += found
        return found

    def close_launch(self, record: LaunchRecord) -> None:
        """The operation has finished: nothing more will be observed for it."""
        self._open.discard(record.seq)
        if not self._open:
            for buffer in self._unpruned:
                self._prune(buffer)
            self._unpruned.clear()

    def _add(self, access: Access) -> list[Conflict]:
        found: list[Conflict] = []
        live = self._live.setdefault(access.buffer, [])
        for prior in live:
            if (
                prior.seq != access.seq
                and (access.is_write or prior.is_write)
                and overlaps(prior.region, access.region)
                and not access.ordered_with(prior)
            ):
                earlier, later = (prior, access) if prior.seq < access.seq else (access, prior)
                key = (earlier.seq, later.seq, access.buffer)
                index = self._reported.get(key)
                if index is None:
                    self._reported[key] = len(self._conflicts) + len(found)
                    found.append(Conflict(earlier, later))
                elif access.frame is not None:  # the pair, already reported from a declaration, gets its frame
                    # (a launch's declared and observed accesses are both live: the pair may be in `found`)
                    reported = self._conflicts if index < len(self._conflicts) else found
                    at = index if reported is self._conflicts else index - len(self._conflicts)
                    reported[at] = reported[at].with_frame(access)
        live.append(access)
        self._unpruned.add(access.buffer)
        self._conflicts.extend(found)
        return found

    def _prune(self, buffer: Buffer) -> None:
        """Drop accesses that a later one replaces. Only while no operation is open: an access still
        to be observed may fall between an access and its replacement, which the argument below needs
        not to happen."""
        kept: list[Access] = []
        for access in sorted(self._live[buffer], key=lambda a: a.seq):
            kept = [prior for prior in kept if not self._replaces(access, prior)]
            kept.append(access)
        self._live[buffer] = kept

    @staticmethod
    def _replaces(access: Access, prior: Access) -> bool:
        return (
            prior.seq < access.seq
            and access.clock.get(prior.stream, 0) >= prior.seq
            and covers(access.region, prior.region)
            and (access.is_write or not prior.is_write)
        )

    def mark(self, stream: StreamId) -> SeqNum:
        """A point in the stream's program order that touches nothing (a gate the device holds the
        stream at): events recorded on the stream after it, and streams that wait for them, know it."""
        seq = next(self._seqs)
        self._clock(stream)[stream] = seq
        return seq

    def reached(self, stream: StreamId, other: StreamId, seq: SeqNum) -> bool:
        """Whether `stream`'s work issued so far is ordered after `other`'s operation `seq`: it then
        cannot run on before `other` has run past that point."""
        return self._streams.get(stream, {}).get(other, 0) >= seq

    def record(self, event: EventId, stream: StreamId) -> None:
        self._events[event] = dict(self._clock(stream))
        self._timeline.append(Recorded(event, stream, self._events[event]))

    def checkpoint(self, stream: StreamId) -> None:
        """Mark the current point of `stream`'s program in the timeline, with what it is ordered after there."""
        self._timeline.append(Checkpoint(stream, dict(self._clock(stream))))

    def take_timeline(self) -> list[TimelineEntry]:
        """The entries since the last take, in issue order; the timeline is empty afterwards."""
        taken, self._timeline = self._timeline, []
        return taken

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
        """Feed one replay of ``graph`` on ``stream`` into the tracker, every node closed at once."""
        found: list[Conflict] = []
        for record in self.replay_launches(graph, stream):
            self.close_launch(record)
            found += record.conflicts
        return found

    def replay_launches(self, graph: CapturedGraph, stream: StreamId) -> list[LaunchRecord]:
        """One replay of ``graph`` on ``stream``; its launch nodes' records, still open, in node order.

        Capture-local streams other than 0 become fresh virtual streams (negative ids) that
        fork from ``stream`` at replay start and join back into it at the end, as a graph
        launch does; record and wait nodes act on the tracker's events, so an event recorded
        inside the graph can order work on other streams after the replay."""
        fork = dict(self._clock(stream))
        streams: dict[int, StreamId] = {0: stream}
        records: list[LaunchRecord] = []
        for node in graph.nodes:
            if node.stream not in streams:
                streams[node.stream] = next(self._virtual_streams)
                self._streams[streams[node.stream]] = dict(fork)
            on = streams[node.stream]
            if node.kind == "launch":
                records.append(self.open_launch(on, node.op, dict(node.reads), dict(node.writes), graph=graph.name))
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
        return records
