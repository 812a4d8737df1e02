"""What a judged case produced: the runs' records, the oracles' findings, the case's result.

Below the engine and the oracles, so that both (and a new oracle) share them without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from harness.case import Case
from harness.hb import Conflict
from harness.observe import UndeclaredAccess
from harness.world import BatchWorld


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
    """What one execution of a case produced, batch by batch, copied to the CPU."""

    outputs: list[dict[str, torch.Tensor]] = field(default_factory=list)
    notes: list[list[tuple[str, dict]]] = field(default_factory=list)
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


@dataclass
class CaseResult:
    case: Case
    findings: list[Finding]
    overlapped: RunRecord
    barriered: RunRecord
    seconds: float
    replay: str = ""
