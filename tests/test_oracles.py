"""Every oracle fires on a planted bug and stays quiet on the clean reference, on the same case."""

from __future__ import annotations

import pytest

from harness.case import Batch, Case, Flags, Mutation, Request
from harness.engine import run_case
from harness.mutants import mutant_target
from harness.target import ReferenceTarget

PLAIN = Case(batches=(Batch(requests=(Request(5, 3),), mutations=(Mutation("req_to_token_rewrite"),)),))
GRAPH = Case(batches=(Batch(requests=(Request(5, 3), Request(0, 2)), graph=True,
                            mutations=(Mutation("swa_clear", count=3),)),))

PLANTED = [
    ("differential", "scheduler_no_wait", PLAIN),
    ("happens-before", "scheduler_no_wait", PLAIN),
    ("policy", "fast_path_lost", PLAIN),
    ("float64", "padded_rows_live_slot", GRAPH),
    ("kv", "padded_rows_live_slot", GRAPH),
    ("execution", "missing_token_to_kv_pool", PLAIN),
]


@pytest.mark.parametrize("oracle,mutant,case", PLANTED, ids=[p[0] for p in PLANTED])
def test_oracle_fires_on_its_planted_bug_and_not_on_the_clean_reference(oracle, mutant, case):
    only = frozenset({oracle})
    assert run_case(ReferenceTarget(), case, oracles=only).findings == []
    findings = run_case(mutant_target(mutant), case, oracles=only).findings
    assert findings and {f.oracle for f in findings} == {oracle}


def test_a_mutation_that_never_ran_is_a_finding():
    case = Case(flags=Flags(hisparse=True), batches=(Batch(requests=(Request(0, 2),),
                                                           mutations=(Mutation("hisparse_evict"),)),))
    assert run_case(ReferenceTarget(), case).findings == []  # it evicts plain slots when no block exists


    from harness import mutator

    original = mutator.Mutator._hisparse_evict
    mutator.Mutator._hisparse_evict = lambda self, m: None
    try:
        kinds = [f.kind for f in run_case(ReferenceTarget(), case).findings]
    finally:
        mutator.Mutator._hisparse_evict = original
    assert kinds == ["mutation-never-ran"]


def test_a_finding_names_the_request_row_and_values():
    finding = run_case(mutant_target("scheduler_no_wait"), PLAIN, oracles=frozenset({"differential"})).findings[0]
    assert "request 0" in finding.message and "position" in finding.message and "overlapped" in finding.message
