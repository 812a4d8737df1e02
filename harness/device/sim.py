"""The CPU stream/event simulator.

Each stream is a queue of operations. An operation is runnable when it heads its queue and, for a
wait, when the record it waits on has run. A policy picks among the runnable heads:

- ``adversarial``: the scheduler stream first, whenever it may run (mutations as early as allowed);
- ``random:SEED``: a seeded uniform choice;
- ``forced:CHOICES``: one letter per decision (the first letter of the chosen stream's name); past
  its end, the adversarial choice. Exhaustive exploration enumerates these strings.

Every run records its decisions, so any executed order prints as a ``forced:`` string that replays it.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from harness.device.base import Device, Event, OpFailed, Stream
from harness.device.kind import DeviceKind
from harness.errors import InvalidArgument

POLICIES = ("adversarial", "random:SEED", "forced:CHOICES")


@dataclass
class _Op:
    label: str
    fn: Optional[Callable[[], None]] = None
    waits_for: Optional["_Op"] = None  # a wait: the record it waits on
    done: bool = False


@dataclass
class Decision:
    """A point where more than one stream could run: what was chosen and what else was possible."""

    chosen: str
    options: tuple[str, ...]


class SimDevice(Device):
    kind = DeviceKind.CPU

    def __init__(self, schedule: str = "adversarial", *, observe: bool = False) -> None:
        if torch.get_num_threads() > 1:  # the simulator's ops are small: threads only contend
            torch.set_num_threads(1)
        self.policy, self._rng, self._forced = _parse_policy(schedule)
        self.schedule = schedule
        self._queues: dict[Stream, deque[_Op]] = {}
        self._records: dict[int, _Op] = {}
        self.decisions: list[Decision] = []
        self._trace: list[str] = []
        super().__init__(observe)

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cpu")

    def _queue(self, stream: Stream) -> deque[_Op]:
        return self._queues.setdefault(stream, deque())

    def _issue(self, stream: Stream, op: str, fn: Callable[[], None]) -> None:
        self._queue(stream).append(_Op(op, fn))

    def _record(self, event: Event, stream: Stream) -> None:
        op = _Op(f"record(e{event.id})")
        self._records[event.id] = op
        event.native = op
        self._queue(stream).append(op)

    def _wait(self, stream: Stream, event: Event) -> None:
        # CUDA semantics: a wait binds to the event's most recent record at the time of the call;
        # waiting on an event never recorded is a no-op.
        target = self._records.get(event.id)
        if target is not None and not target.done:
            self._queue(stream).append(_Op(f"wait(e{event.id})", waits_for=target))

    def delay(self, cycles: int) -> None:
        if cycles:
            self.delays.append(cycles)

    def _runnable(self) -> list[Stream]:
        ready = []
        for stream, queue in self._queues.items():
            if queue and (queue[0].waits_for is None or queue[0].waits_for.done):
                ready.append(stream)
        return sorted(ready, key=lambda s: s.name)

    def _choose(self, ready: list[Stream]) -> Stream:
        if len(ready) == 1:
            return ready[0]
        options = tuple(s.name[0].upper() for s in ready)
        adversarial = next((s for s in ready if s is self.schedule_stream), ready[-1])
        if self.policy == "random":
            pick = self._rng.choice(ready)
        elif self.policy == "forced" and len(self.decisions) < len(self._forced):
            letter = self._forced[len(self.decisions)]
            pick = next((s for s in ready if s.name[0].upper() == letter), None)
            if pick is None:
                raise InvalidArgument(
                    f"schedule forced:{self._forced}: decision {len(self.decisions)} asks for stream {letter!r} "
                    f"but only {', '.join(options)} can run there"
                )
        else:
            pick = adversarial
        self.decisions.append(Decision(pick.name[0].upper(), options))
        return pick

    def _synchronize(self) -> None:
        while True:
            ready = self._runnable()
            if not ready:
                break
            self._run_head(self._choose(ready))
        self._check_stuck()

    def _catch_up(self, stream: Stream) -> None:
        """Host work on `stream` comes after what the stream was given: run its queue (other streams
        only where it waits on them, chosen by the policy)."""
        while self._queues.get(stream):
            ready = self._runnable()
            if not ready:
                self._check_stuck()
            self._run_head(stream if stream in ready else self._choose(ready))

    def _run_head(self, stream: Stream) -> None:
        op = self._queues[stream].popleft()
        if op.fn is not None:
            try:
                op.fn()
            except Exception as exc:  # the program's own failure becomes a finding, with its op
                self._drain()
                raise OpFailed(op.label, stream.name, exc) from exc
        op.done = True
        self._trace.append(f"{stream.name}:{op.label}")

    def _check_stuck(self) -> None:
        stuck = {s.name: q[0].label for s, q in self._queues.items() if q}
        if stuck:
            raise RuntimeError(f"simulated deadlock: streams blocked at {stuck}")

    def _drain(self) -> None:
        for queue in self._queues.values():
            queue.clear()

    def trace(self) -> list[str]:
        return list(self._trace)

    def forced_string(self) -> str:
        """The decisions of this run, replayable with ``forced:<this>``."""
        return "".join(d.chosen for d in self.decisions)


def _parse_policy(schedule: str):
    if schedule == "adversarial":
        return "adversarial", None, ""
    kind, _, arg = schedule.partition(":")
    if kind == "random":
        try:
            return "random", random.Random(int(arg)), ""
        except ValueError:
            pass
    if kind == "forced" and set(arg) <= set("FS"):
        return "forced", None, arg
    raise InvalidArgument(f"schedule={schedule!r} is not one of: {', '.join(POLICIES)} (CHOICES: letters F and S)")
