"""Issue 30's figure over a campaign: how long before the forward's end the scheduler started on a batch's result.

The engine measures it per batch on a device with a clock (`RunRecord.overlap_ms`, from CUDA's
`take_overlap_ms`); the `fast-path` oracle judges the same thing by order, this says how much it bought in
time. A campaign tallies its overlapped runs' batches here, those whose target published read-done apart from
the others: publishing is what lets the scheduler start while the forward still runs, and a batch that does not
publish makes it wait for the whole forward, so the second group is the first's control. `summary.json`'s
`fast_path_overlap` is the tally (`FastPathOverlap.to_dict`), `merge` adds the tallies of shards.

On the ground floor, importing nothing of the harness, so that the campaign, an isolated child's answer and the
report's merge and page share one reading of the figure.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

# A start this long before the forward's end counts as overlapped; closer is the two timing events' noise (a
# batch that did not publish measures within it, tests/test_cuda_device.py).
OVERLAPPED_ABOVE_MS = 0.05
# Measured values a group keeps, in the order judged, for its median (the counts and extremes stay exact past it):
# it bounds summary.json at some 70 kB a group however long the campaign.
KEPT_VALUES = 10_000


@dataclass(frozen=True)
class BatchOverlap:
    """One batch of an overlapped run: whether its target published read-done (noted `Publish`), and how many ms
    before the forward's end the scheduler's stream started on its result (negative: after; None: not measured,
    on a device without a clock, or in a run that crashed at that batch)."""

    published: bool
    ms: float | None


@dataclass
class OverlapGroup:
    """The measurements of one kind of batch (publishing or not): counts and extremes exact, values kept up to
    KEPT_VALUES for the median, which cannot be added across shards as counts can."""

    batches: int = 0
    measured: int = 0
    overlapped: int = 0  # measured more than OVERLAPPED_ABOVE_MS before the forward's end
    min_ms: float | None = None
    max_ms: float | None = None
    values_ms: list[float] = field(default_factory=list)

    def add(self, ms: float | None) -> None:
        self.batches += 1
        if ms is not None:
            value = round(ms, 3) + 0.0  # + 0.0: a rounded -0.0004 is 0, not "-0"
            self._add_measured(1, int(ms > OVERLAPPED_ABOVE_MS), value, value, [value])

    def merge(self, other: OverlapGroup) -> None:
        self.batches += other.batches
        if other.measured:
            self._add_measured(other.measured, other.overlapped, other.min_ms, other.max_ms, other.values_ms)

    def _add_measured(self, measured: int, overlapped: int, low: float, high: float, values: list[float]) -> None:
        self.measured += measured
        self.overlapped += overlapped
        self.min_ms = low if self.min_ms is None else min(self.min_ms, low)
        self.max_ms = high if self.max_ms is None else max(self.max_ms, high)
        self.values_ms.extend(values[: KEPT_VALUES - len(self.values_ms)])

    def to_dict(self) -> dict:
        """The group as `summary.json` holds it; `median_ms` is the kept values' (all of them up to KEPT_VALUES)."""
        median = round(statistics.median(self.values_ms), 3) if self.values_ms else None
        return {"batches": self.batches, "measured": self.measured, "overlapped": self.overlapped,
                "min_ms": self.min_ms, "median_ms": median, "max_ms": self.max_ms, "values_ms": list(self.values_ms)}

    @classmethod
    def from_dict(cls, data: dict) -> OverlapGroup:
        """A group read back from a summary (its median is recomputed from the values, not read)."""
        return cls(data["batches"], data["measured"], data["overlapped"], data["min_ms"], data["max_ms"],
                   list(data["values_ms"]))


@dataclass
class FastPathOverlap:
    """A campaign's tally of the batches its overlapped runs judged, publishing and not."""

    publishing: OverlapGroup = field(default_factory=OverlapGroup)
    not_publishing: OverlapGroup = field(default_factory=OverlapGroup)

    def add(self, batches: Iterable[BatchOverlap]) -> None:
        for batch in batches:
            (self.publishing if batch.published else self.not_publishing).add(batch.ms)

    def merge(self, other: FastPathOverlap) -> None:
        self.publishing.merge(other.publishing)
        self.not_publishing.merge(other.not_publishing)

    @property
    def measured(self) -> bool:
        return bool(self.publishing.measured or self.not_publishing.measured)

    def to_dict(self, *, timed: bool) -> dict:
        """`summary.json`'s `fast_path_overlap`: the two groups, or, when nothing was measured, only why (never a
        row of zeros that reads as "no overlap"). `timed`: whether the campaign's device has a clock."""
        if not self.measured:
            return {"unmeasured": _unmeasured_reason(timed)}
        return {"overlapped_above_ms": OVERLAPPED_ABOVE_MS, "publishing": self.publishing.to_dict(),
                "not_publishing": self.not_publishing.to_dict()}

    @classmethod
    def from_dict(cls, data: dict) -> FastPathOverlap:
        return cls(OverlapGroup.from_dict(data["publishing"]), OverlapGroup.from_dict(data["not_publishing"]))


def _unmeasured_reason(timed: bool) -> str:
    if not timed:
        return "the device has no clock: the simulator orders the streams, it does not time them (measured on CUDA)"
    return ("no overlapped run reached the scheduler's processing of a batch's result (none judged, or each crashed "
            "first)")


def merge(tallies: list[dict]) -> dict:
    """Shards' `fast_path_overlap` as one: counts added, extremes kept, values pooled (up to KEPT_VALUES) for the
    median. A shard that measured nothing adds nothing; when none did, the first one's reason stands."""
    measured = [FastPathOverlap.from_dict(tally) for tally in tallies if "unmeasured" not in tally]
    if not measured:
        return tallies[0]
    total = FastPathOverlap()
    for part in measured:
        total.merge(part)
    return total.to_dict(timed=True)


def describe(tally: dict) -> str:
    """The tally in one line, for the run's output and the page: where the median publishing batch's scheduler
    started against the forward's end, and on how many batches of each group it started before it."""
    if "unmeasured" in tally:
        return f"not measured: {tally['unmeasured']}"
    publishing, other = tally["publishing"], tally["not_publishing"]
    overlapped = (f"more than {tally['overlapped_above_ms']:g} ms before on {publishing['overlapped']} of "
                  f"{_measured(publishing)} publishing batches and on {other['overlapped']} of {_measured(other)} "
                  "that did not publish")
    if not publishing["measured"]:
        return f"no publishing batch measured; {overlapped}"
    kept = len(publishing["values_ms"])
    median = "median" if kept == publishing["measured"] else f"median of the first {kept}"
    return (f"the scheduler started {_against_end(publishing['median_ms'])} the forward ended on a publishing batch "
            f"({median}; min {publishing['min_ms']:.3f}, max {publishing['max_ms']:.3f} ms before the end), "
            f"{overlapped}")


def _against_end(ms: float) -> str:
    return f"{ms:.3f} ms before" if ms >= 0 else f"{-ms:.3f} ms after"


def _measured(group: dict) -> str:
    """The measured count, and the judged one where some batch went unmeasured (its run crashed there)."""
    if group["measured"] == group["batches"]:
        return str(group["measured"])
    return f"{group['measured']} measured ({group['batches']} judged)"
