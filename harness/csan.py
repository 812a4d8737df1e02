"""PyTorch's CUDA Sanitizer (CSAN) as a second opinion on real streams, and where the opinions differ.

CSAN sees what passes through torch's dispatcher: every aten kernel, event records and waits. It
cannot see the kernels a CUDA-graph replay launches, nor a Triton launch, nor a read whose tensor
the kernel reaches through an index it loaded itself. Our tracker sees what the target declares,
graph replays included. Each case is judged three ways (our happens-before tracker, the
differential oracle, CSAN) and every disagreement is reported with the reason when one is known.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
from hypothesis import HealthCheck, Phase, example, given, settings

from harness.case import GRAPH_CONTRACTS
from harness.engine import run_case
from harness.errors import EnvironmentBroken
from harness.kernels import sparse_attention_for
from harness.model.attention import sparse_attention
from harness.strategies import cases, seed_cases
from harness.targets import REFERENCE, TargetSpec
from harness.targets.protocol import GraphReplay
from harness.validation import check_positive

GRAPH_BLIND = "CSAN cannot see the kernels a CUDA-graph replay launches"
TRITON_BLIND = "CSAN cannot see Triton launches (they bypass torch's dispatcher)"


@dataclass(frozen=True)
class CsanError:
    """One unsynchronised access pair as CSAN reported it."""

    operator: str
    previous_operator: str
    stream: int
    previous_stream: int
    kind: str  # "read after write", "write after read", ...

    def __str__(self) -> str:
        return (f"{self.kind}: {self.operator.split('(')[0]} on stream {self.stream} is unordered with "
                f"{self.previous_operator.split('(')[0]} on stream {self.previous_stream}")


class CsanObserver:
    """CSAN switched on around one execution at a time, its state fresh for each.

    Errors are collected instead of raised, so an execution runs to its end and our own oracles
    judge the same run CSAN watched.
    """

    def __init__(self) -> None:
        if not torch.cuda.is_available():
            raise EnvironmentBroken("CSAN needs a CUDA device: torch.cuda.is_available() is False")
        from torch.cuda import _sanitizer

        self._sanitizer = _sanitizer.cuda_sanitizer
        self._handler = self._sanitizer.dispatch.event_handler
        self.errors: list[CsanError] = []
        launch = type(self._handler)._handle_kernel_launch
        handler = self._handler

        def collect(*args, **kwargs):
            self.errors.extend(_describe(e) for e in launch(handler, *args, **kwargs))
            return []

        handler._handle_kernel_launch = collect

    @contextlib.contextmanager
    def observing(self) -> Iterator[list[CsanError]]:
        self._handler.__init__()  # forget the previous case's tensors, streams and events
        self.errors = []
        self._sanitizer.enable()
        try:
            yield self.errors
        finally:
            self._sanitizer.disable()


def _describe(error) -> CsanError:
    current, previous = error.current_access, error.previous_access
    kind = f"{_access(current.type)} after {_access(previous.type)}"
    return CsanError(str(current.operator), str(previous.operator), current.stream, previous.stream, kind)


def _access(access_type) -> str:
    return "write" if access_type.name == "WRITE" else "read"


@dataclass
class Opinions:
    """One case judged three ways."""

    case_summary: str
    replay: str
    hb: list[str]
    differential: list[str]
    csan: list[str]
    graph_replays: int
    triton_attention: bool

    @property
    def verdict(self) -> str:
        ours, theirs = bool(self.hb), bool(self.csan)
        if ours == theirs:
            return "agree-race" if ours else "agree-clean"
        return "ours-only" if ours else "csan-only"

    @property
    def explanation(self) -> Optional[str]:
        """Why CSAN missed what ours found, where the reason is one CSAN is known to have."""
        if self.verdict != "ours-only":
            return None
        reasons = []
        if any("graph" in c for c in self.hb):
            reasons.append(GRAPH_BLIND)
        if self.triton_attention and any("attention" in c for c in self.hb):
            reasons.append(TRITON_BLIND)
        return "; ".join(reasons) or None


def judge_with_csan(observer: CsanObserver, target, case, *, target_spec: TargetSpec = REFERENCE) -> Opinions:
    with observer.observing() as errors:
        result = run_case(target, case, "cuda", target_spec=target_spec)
        csan = sorted({str(e) for e in errors})
    run = result.overlapped
    hb = [str(c) for c in run.conflicts]
    differential = [f.message for f in result.findings if f.oracle == "differential"]
    replays = sum(1 for notes in run.notes for record in notes if isinstance(record, GraphReplay))
    return Opinions(case.summary(), result.replay, hb, differential, csan, replays,
                    sparse_attention_for("cuda") is not sparse_attention)


def second_opinion_campaign(target, *, examples: int, semantics: str = "0.5.23",
                            target_spec: TargetSpec = REFERENCE) -> dict:
    """The protocol's seed shapes, then drawn cases (derandomized), each judged three ways."""
    check_positive(examples, "examples")
    observer = CsanObserver()
    judged: list[Opinions] = []
    dims = tuple(sorted(getattr(target, "fixed_dims", {}).items()))  # the sizes the target runs at
    contracts = getattr(target, "graph_contracts", GRAPH_CONTRACTS)  # and the graph contracts it has
    seeds = seed_cases(semantics, dims=dims, contracts=contracts)[:examples]

    @settings(max_examples=max(1, examples - len(seeds)), derandomize=True, database=None, deadline=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=cases(semantics, dims=dims, contracts=contracts,
                      uniform_draft_width=getattr(target, "uniform_draft_width", False)))
    def one(case):
        if len(judged) < examples:
            judged.append(judge_with_csan(observer, target, case, target_spec=target_spec))

    for case in reversed(seeds):
        one = example(case=case)(one)
    one()
    return summarise(judged)


def summarise(judged: list[Opinions]) -> dict:
    counts: dict[str, int] = {}
    for o in judged:
        counts[o.verdict] = counts.get(o.verdict, 0) + 1
    disagreements = [
        {"verdict": o.verdict, "explanation": o.explanation, "case": o.case_summary, "replay": o.replay,
         "ours": o.hb[:3], "csan": o.csan[:3], "differential": o.differential[:3], "graph_replays": o.graph_replays}
        for o in judged if o.verdict in ("ours-only", "csan-only")]
    return {
        "cases": len(judged), "verdicts": counts,
        "differential_findings": sum(1 for o in judged if o.differential),
        "graph_cases": sum(1 for o in judged if o.graph_replays),
        "unexplained": sum(1 for d in disagreements if d["explanation"] is None),
        "disagreements": disagreements,
    }
