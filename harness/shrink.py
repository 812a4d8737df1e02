"""Shrinking a failing case that hypothesis cannot shrink: one found on a seed case.

Hypothesis shrinks what it drew, through its choice sequence; an explicit example (a seed case) has
no choice sequence, so hypothesis reports it as it was written. This greedy pass starts from such a
case and keeps any simplification after which the same finding (oracle and kind) still appears:
fewer batches, fewer requests and mutations, shorter requests, eager instead of graph, EXTEND
instead of the other modes, one layer, no injected delay.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, Iterator

from harness.case import Batch, Case
from harness.errors import InvalidArgument
from harness.model.enums import ForwardMode


def finding_signature(result) -> tuple[str, str]:
    """What must stay the same for a smaller case to count as the same failure."""
    first = result.findings[0]
    return first.oracle, first.kind


def shrink_failure(run_case: Callable[[Case], object], result, *, budget_s: float):
    """The CaseResult of the smallest failing case found by greedy shrinking of `result.case` under
    `run_case` (a case to its CaseResult) for at most `budget_s` seconds; each kept step restarts the
    candidates from the smaller case."""
    started = time.perf_counter()
    want = finding_signature(result)
    best, best_result = result.case, result
    improved = True
    while improved and time.perf_counter() - started < budget_s:
        improved = False
        for candidate in _simpler(best):
            if time.perf_counter() - started >= budget_s:
                break
            try:
                candidate.validate()
            except InvalidArgument:
                continue
            judged = run_case(candidate)
            if judged.findings and any((f.oracle, f.kind) == want for f in judged.findings):
                best, best_result, improved = candidate, judged, True
                break
    return best_result


def _simpler(case: Case) -> Iterator[Case]:
    """Candidates one step simpler than `case`, the biggest cuts first."""
    batches = case.batches
    for i in range(len(batches)):
        if len(batches) > 1:
            yield replace(case, batches=batches[:i] + batches[i + 1:])
    if len(case.dims.layer_ratios) > 1:
        for ratio in dict.fromkeys(case.dims.layer_ratios):
            yield replace(case, dims=replace(case.dims, layer_ratios=(ratio,)))
    if case.delay_cycles:
        yield replace(case, delay_cycles=0)
    for i, batch in enumerate(batches):
        for simpler in _simpler_batch(batch):
            yield replace(case, batches=batches[:i] + (simpler,) + batches[i + 1:])


def _simpler_batch(batch: Batch) -> Iterator[Batch]:
    reqs, muts = batch.requests, batch.mutations
    for j in range(len(reqs)):
        if len(reqs) > 1:
            yield replace(batch, requests=reqs[:j] + reqs[j + 1:])
    for j in range(len(muts)):
        yield replace(batch, mutations=muts[:j] + muts[j + 1:])
    if batch.graph:
        yield replace(batch, graph=False)
    if batch.mode not in (ForwardMode.EXTEND, ForwardMode.IDLE):
        yield replace(batch, mode=ForwardMode.EXTEND)
    for j, r in enumerate(reqs):
        shorter_lengths = ([replace(r, extend_len=n) for n in (1, r.extend_len // 2) if 1 <= n < r.extend_len]
                           + [replace(r, prefix_len=n) for n in (0, r.prefix_len // 2) if n < r.prefix_len])
        for shorter in dict.fromkeys(shorter_lengths):
            yield replace(batch, requests=reqs[:j] + (shorter,) + reqs[j + 1:])
    for j, m in enumerate(muts):
        if m.count > 1:
            yield replace(batch, mutations=muts[:j] + (replace(m, count=1),) + muts[j + 1:])
        if m.poison:
            yield replace(batch, mutations=muts[:j] + (replace(m, poison=False),) + muts[j + 1:])
