"""Plan numbers for SGLang's own metadata and chunk caches, for the `freshness` oracle.

The oracle asks that every plan a forward reads (its attention metadata, its sparse-prefill chunk cache) was
planned earlier in the same batch (`harness.probe.Planned`, `PlanRead`). The reference model numbers its plans
on the objects; SGLang's objects carry no number, and a breakable-graph bucket's captured metadata is one
object refilled by every replay, so identity alone cannot tell this batch's plan from a kept one. `Plans` gives
an object the number of its latest planning, keyed by identity (the object is held, so its id is not reused
while the session lives); the session notes a planning where SGLang's code plans (metadata init, the
breakable replay's refresh, the resolver's or a layer's chunk-cache build) and a read where a forward reads.
"""

from __future__ import annotations

import itertools
from typing import Any, Optional

from harness.probe import PlanKind, Planned, PlanRead


class Plans:
    """One session's plan numbers; `probe`: where the records go (the session's probe)."""

    def __init__(self, probe):
        self.probe = probe
        self._numbers = itertools.count(1)
        self._latest: dict[int, tuple[Any, int]] = {}  # id(object) -> (the object, its latest plan number)

    def planned(self, kind: PlanKind, plan: Any) -> None:
        """`plan` was just filled for the batch in flight: a new number, noted."""
        number = next(self._numbers)
        self._latest[id(plan)] = (plan, number)
        self.probe.note(Planned(kind, number))

    def number(self, plan: Any) -> Optional[int]:
        """The latest planning's number of `plan`; None for None (nothing to read) or an object never planned."""
        held = self._latest.get(id(plan)) if plan is not None else None
        return held[1] if held is not None and held[0] is plan else None

    def read(self, kind: PlanKind, plan: Any) -> None:
        """A forward reads `plan` (None: the backend holds nothing, as after an idle step's drop)."""
        self.probe.note(PlanRead(kind, self.number(plan)))


__all__ = ["Plans"]
