"""The oracle registry: an oracle is a function from a judged case to findings, registered under its name.

`engine.oracle_findings` runs every registered oracle, in the order they were registered; `--oracles` accepts the
registered names; the report page lists the oracles that judged a campaign. Adding an oracle is one module
that decorates its check with `@oracle(...)` and is imported once (the built-in ones by
`harness/oracles/__init__.py`; your own by your target's module or a `conftest.py`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

from harness.case import Case
from harness.errors import HarnessError, InvalidArgument
from harness.findings import Finding, RunRecord


@dataclass(frozen=True)
class Judged:
    """What an oracle judges: the case, its overlapped (observed) run and its barriered run; for a whole case
    (not one interleaving of an exploration) also the target and the device; and the `--oracles` selection."""

    case: Case
    overlapped: RunRecord
    barriered: RunRecord
    target: Any = None  # None while exploring: only the runs are judged
    device_name: str = "cpu"
    selected: Optional[frozenset] = None  # None: every oracle

    def selects(self, name: str) -> bool:
        return self.selected is None or name in self.selected


def _always(judged: Judged) -> bool:
    return True


@dataclass(frozen=True)
class Oracle:
    name: str  # what `--oracles` accepts and what its findings are filed under
    check: Callable[[Judged], list[Finding]]
    summary: str  # one line: what it catches
    applies: Callable[[Judged], bool] = _always  # False: not run on this case (a missing run, a target it cannot ask)


_REGISTRY: dict[str, Oracle] = {}


def oracle(name: str, summary: str, *, applies: Callable[[Judged], bool] = _always):
    """Register the decorated `check(judged) -> list[Finding]` as the oracle `name`, after those registered
    before it. Its findings are kept when `--oracles` selects the oracle they are filed under."""

    def register(check: Callable[[Judged], list[Finding]]):
        if name in _REGISTRY:
            raise HarnessError(f"oracle {name!r} is registered twice ({_REGISTRY[name].check.__module__} and "
                               f"{check.__module__})")
        _REGISTRY[name] = Oracle(name, check, summary, applies)
        return check

    return register


def unregister(name: str) -> None:
    """Remove an oracle (a test's toy oracle, once the test is done)."""
    _REGISTRY.pop(name, None)


def registered() -> tuple[Oracle, ...]:
    return tuple(_REGISTRY.values())


def oracle_names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def parse_oracles(text: Optional[str], name: str = "oracles") -> Optional[frozenset]:
    """`a,b`: a subset of the registered names; None (every oracle) when not given. A bad one is refused
    naming it `name`, the caller's name for it (`--oracles` on the command line)."""
    if text is None:
        return None
    names = frozenset(n.strip() for n in text.split(",") if n.strip())
    unknown = sorted(names - set(_REGISTRY))
    if not names:  # once read as "every oracle"
        raise InvalidArgument(f"{name}={text!r} names no oracle; give a comma-separated subset of: "
                              f"{', '.join(_REGISTRY)} (or leave the option out for all)")
    if unknown:
        raise InvalidArgument(f"{name}: unknown {', '.join(unknown)}; allowed: {', '.join(_REGISTRY)}")
    return names


def apply_oracles(judged: Judged, *, seconds: Optional[dict[str, float]] = None) -> list[Finding]:
    """Every registered oracle that applies, in registration order; the findings `--oracles` selects.
    `seconds`, when given, gets each oracle's time (the campaign report shows where a case's time goes)."""
    findings: list[Finding] = []
    for o in _REGISTRY.values():
        if o.applies(judged):
            began = time.perf_counter()
            findings += [f for f in o.check(judged) if judged.selects(f.oracle)]
            if seconds is not None:
                seconds[o.name] = seconds.get(o.name, 0.0) + time.perf_counter() - began
    return findings
