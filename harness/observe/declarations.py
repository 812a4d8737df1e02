"""Observed accesses against declared ones.

Declarations stay (the harness stands in for parts of the system) but are checked: what an op was
seen to touch is judged by its declaration where the observer cannot see the rows itself, and an
access to a shared buffer outside what the op declared is an `UndeclaredAccess`, a finding of its own,
so a wrong declaration can never hide a race.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, NamedTuple, Optional

from harness.hb import Region, covers, describe_region, union


@dataclass(frozen=True)
class UndeclaredAccess:
    """An access a launched operation made to a shared buffer outside what it declared."""

    op: str
    stream: int
    seq: int
    buffer: str
    region: Region
    is_write: bool
    declared: Region  # what the op declared for this buffer and kind; absent: not declared at all
    declared_at_all: bool
    frame: Optional[str]

    def __str__(self) -> str:
        kind = "write" if self.is_write else "read"
        said = (f"it declared only {describe_region(self.declared)}" if self.declared_at_all
                else f"it declared no {kind} of {self.buffer!r}")
        at = f" at {self.frame}" if self.frame else ""
        return (f"undeclared {kind} of {self.buffer!r} ({describe_region(self.region)}) by {self.op!r} "
                f"on stream {self.stream} (seq {self.seq}){at}: {said}; the tracker judged the observed access")


class Seen(NamedTuple):
    """One access an op was seen to make. `exact`: the region is what the op touches; otherwise only
    the buffer is known (a kernel's pointer, an index the host cannot read) and the region is the
    span, which the launch's declaration may narrow."""

    buffer: str
    region: Region
    is_write: bool
    shared: bool
    exact: bool


def _declared(buffer: str, is_write: bool, reads: Mapping, writes: Mapping) -> tuple[bool, Region]:
    """Whether the op declared this kind of access to `buffer` (a write declaration covers reads too),
    and the region it declared."""
    present = [d[buffer] for d in ((writes,) if is_write else (reads, writes)) if buffer in d]
    widest: Region = frozenset()
    for part in present:
        widest = union(widest, part)
    return bool(present), widest


def against(seen: Seen, reads: Mapping, writes: Mapping) -> tuple[Region, bool]:
    """The region to judge an observed access by, and whether its op declared it. An exact access is
    judged as seen and must lie inside the declaration; an inexact one (only its buffer is known) is
    narrowed to the declared region when the op declared that buffer at all."""
    present, declared = _declared(seen.buffer, seen.is_write, reads, writes)
    if seen.exact:
        return seen.region, present and covers(declared, seen.region)
    if not present:
        return seen.region, False
    if declared is None:
        return seen.region, True
    return (declared if seen.region is None else declared & seen.region), True


def undeclared(op, stream, seq, seen: Seen, reads, writes, frame) -> UndeclaredAccess:
    """The finding for an access its op did not declare, with what the op did declare of that buffer."""
    present, declared = _declared(seen.buffer, seen.is_write, reads, writes)
    return UndeclaredAccess(op, stream, seq, seen.buffer, seen.region, seen.is_write, declared, present, frame)
