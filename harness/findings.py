"""What a judged case produced: the runs' records, the oracles' findings, the case's result.

Below the engine and the oracles, so that both (and a new oracle) share them without importing each other.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Optional

import torch

from harness.case import Case
from harness.errors import EnvironmentBroken
from harness.hb import Conflict, TimelineEntry
from harness.observe import UndeclaredAccess
from harness.overlap import BatchOverlap
from harness.probe import ProbeRecord, Publish, noted
from harness.world import BatchWorld


def refuse_out_of_memory(exc: BaseException) -> None:
    """A device allocation that fails is the machine's state (its memory shared with other processes, or too small
    for the case), not the target's behaviour: raised as `EnvironmentBroken` (exit 3: the run cannot vouch), never
    reported as a finding (exit 1: an H100 shared by a campaign's children and another campaign once reported a
    2 MiB allocation of a clean case as the target raising)."""
    if isinstance(exc, torch.OutOfMemoryError):
        raise EnvironmentBroken(f"the device ran out of memory during the case ({str(exc).splitlines()[0][:300]}): "
                                "the machine's state, not a finding; judge fewer cases at once (--jobs) or free "
                                "the device") from exc


@contextmanager
def out_of_memory_refused():
    """`refuse_out_of_memory` for the harness's own work around the target's (the pool's state copied after a
    batch, the oracles' decoded copies): an H100 shared by four of a campaign's children ran out copying a case's
    pool, and the child's traceback was reported as the case crashing its process."""
    try:
        yield
    except torch.OutOfMemoryError as exc:
        refuse_out_of_memory(exc)


@dataclass(frozen=True)
class Finding:
    """One oracle's verdict on one case. `details` carries what the report page shows, structured (never
    parsed back out of `message`, which is for people): for a differing output `tensor`, `index`,
    `overlapped` and `barriered` (the first differing values as printed) and, for an attention row, the
    `request`, `pool_row`, `token_row` and `position`; for a float64 mismatch `layer`, `ratio`, `token_row`,
    `request`, `position`, `max_error` and `tolerance`; for the tracker `buffer`, `ops` and `frames`."""

    oracle: str
    kind: str
    message: str
    batch: int = 0
    severity: str = "correctness"  # or "performance"
    details: dict = field(default_factory=dict)


@dataclass
class RunRecord:
    """What one execution of a case produced, batch by batch; the outputs on the device it ran on."""

    outputs: list[dict[str, torch.Tensor]] = field(default_factory=list)
    notes: list[list[ProbeRecord]] = field(default_factory=list)  # per batch, what the target noted
    timeline: list[list[TimelineEntry]] = field(default_factory=list)  # per batch, the tracker's launches and events
    # per batch, ms the scheduler's stream started on the result before the forward ended (CUDA; None elsewhere)
    overlap_ms: list[Optional[float]] = field(default_factory=list)
    forward_stream: int = 0  # the tracker's id of the forward stream (the timeline's stream ids are the tracker's)
    applied: list[list[str]] = field(default_factory=list)
    worlds: list[BatchWorld] = field(default_factory=list)
    conflicts: list[Conflict] = field(default_factory=list)
    undeclared: list[UndeclaredAccess] = field(default_factory=list)
    crash: Optional[tuple[int, str]] = None
    trace: list[str] = field(default_factory=list)
    schedule: str = ""
    decisions: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    delays: list[int] = field(default_factory=list)
    race_window: dict = field(default_factory=dict)
    sut_seconds: float = 0.0  # inside the target's step and the device's execution of it
    setup_seconds: float = 0.0  # inside the target's own open and load (its pools and its forward batch)
    copy_seconds: float = 0.0  # copying the outputs and the KV pools the oracles compare
    delay_seconds: float = 0.0  # of sut_seconds, the host's wait before opening the race gates (CUDA; none on the simulator)


# Where a judged case's time went, in seconds: the keys of CaseResult.phases(), in this order.
PHASES = ("world", "target_setup", "overlapped_forward", "race_delay", "barriered_forward", "output_copies", "oracles",
          "other")


@dataclass
class CaseResult:
    case: Case
    findings: list[Finding]
    overlapped: RunRecord
    barriered: RunRecord
    seconds: float
    replay: str = ""
    world_seconds: float = 0.0  # drawing the batches' data (once for both runs)
    oracle_seconds: dict[str, float] = field(default_factory=dict)  # per oracle

    def gate_openings(self) -> list[str]:
        """How each race gate of the overlapped run opened (CUDA, `harness.device.gates`)."""
        return [gate["opened_by"] for gate in self.overlapped.race_window.get("gates", ())]

    def batch_overlaps(self) -> list[BatchOverlap]:
        """The overlapped run's batches as the campaign tallies them (`harness.overlap`): whether the target
        published read-done (its `Publish` note, not the design's expectation: the figure is what publishing
        bought), and the measured overlap."""
        run = self.overlapped
        return [BatchOverlap(noted(notes, Publish), ms) for notes, ms in zip(run.notes, run.overlap_ms)]

    def phases(self) -> dict[str, float]:
        """Where this case's `seconds` went (PHASES): the forwards include the device's execution of them;
        `race_delay` is the time the host held the overlapped run's race gates open after it was done
        issuing, for the scheduler's work to land (CUDA: `harness.device.gates`)."""
        delay = min(self.overlapped.delay_seconds, self.overlapped.sut_seconds)
        known = {"world": self.world_seconds,
                 "target_setup": self.overlapped.setup_seconds + self.barriered.setup_seconds,
                 "overlapped_forward": self.overlapped.sut_seconds - delay, "race_delay": delay,
                 "barriered_forward": self.barriered.sut_seconds,
                 "output_copies": self.overlapped.copy_seconds + self.barriered.copy_seconds,
                 "oracles": sum(self.oracle_seconds.values())}
        return {**known, "other": max(0.0, self.seconds - sum(known.values()))}
