"""The freshness oracle: a forward reads only what was planned for its own batch, across idle steps and bucket
changes; planted stale state is found, the clean reference is not, and the strategies draw both shapes."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings

from harness.case import Batch, Case, Flags, Mutation, Request
from harness.engine import run_case
from harness.findings import RunRecord
from harness.model.enums import ForwardMode
from harness.mutants.corpus import mutant_target
from harness.oracles.freshness import freshness_oracle
from harness.oracles.registry import Judged
from harness.policy import graph_bucket
from harness.probe import DraftGraphReplay, GraphReplay, PlanKind, Planned, PlanRead
from harness.strategies import cases
from harness.targets import ReferenceTarget

MUT = (Mutation("req_to_token_rewrite"),)
FLAGS = Flags(SGLANG_ENABLE_PREFILL_WAR_READ_DONE=True)
IDLE_STEP = Case(flags=FLAGS, batches=(
    Batch(requests=(Request(5, 3),), mutations=MUT),
    Batch(mode=ForwardMode.IDLE, requests=(), mutations=(Mutation("req_to_token_rewrite", target="other"),)),
    Batch(requests=(Request(2, 4),), mutations=MUT)))
A, B = (Request(5, 3), Request(0, 5)), (Request(2, 9), Request(1, 11))
BUCKET_CHANGE = Case(flags=FLAGS, graph_contract="bcg",
                     batches=tuple(Batch(requests=r, graph=True, mutations=MUT) for r in (A, B, A)))


@pytest.mark.parametrize("semantics", ["0.5.23", "pr"])
@pytest.mark.parametrize("case", [IDLE_STEP, BUCKET_CHANGE], ids=["idle-step", "bucket-change"])
def test_the_clean_reference_reads_only_its_own_plans(semantics, case):
    assert run_case(ReferenceTarget(), replace(case, semantics=semantics)).findings == []


@pytest.mark.parametrize("semantics", ["0.5.23", "pr"])
@pytest.mark.parametrize("mutant,case,batch,kind", [
    ("metadata_kept_across_idle", IDLE_STEP, 1, PlanKind.METADATA),
    ("cache_kept_across_bucket_change", BUCKET_CHANGE, 2, PlanKind.CHUNK_CACHE)])
def test_a_plan_kept_from_an_earlier_step_is_stale(semantics, mutant, case, batch, kind):
    findings = run_case(mutant_target(mutant), replace(case, semantics=semantics),
                        oracles=frozenset({"freshness"})).findings
    assert [(f.kind, f.batch, f.details["plan"], f.details["planned_in"]) for f in findings] == [
        ("stale-plan", batch, kind.value, 0)]


def judged(*batches: list) -> Judged:
    case = Case(batches=tuple(Batch() for _ in batches))
    return Judged(case, RunRecord(notes=[list(b) for b in batches]), RunRecord())


def test_a_plan_is_fresh_only_once_planned_in_the_same_batch_before_the_read():
    m = PlanKind.METADATA
    assert freshness_oracle(judged([Planned(m, 1), PlanRead(m, 1)], [Planned(m, 2), PlanRead(m, 2)])) == []
    read_first = freshness_oracle(judged([PlanRead(m, 1), Planned(m, 1)]))
    assert [(f.batch, f.details["planned_in"]) for f in read_first] == [(0, None)]


def test_a_read_without_a_plan_number_is_not_judged():
    assert freshness_oracle(judged([PlanRead(PlanKind.METADATA, None)], [PlanRead(PlanKind.CHUNK_CACHE, None)])) == []


def _shapes(case: Case) -> set[str]:
    modes = [b.mode for b in case.batches]
    shapes = set()
    if ForwardMode.IDLE in modes[1:] and modes[0] is not ForwardMode.IDLE:
        shapes.add("idle step")
    buckets = [graph_bucket(b.num_tokens) if b.graph else None for b in case.batches]
    if len(buckets) == 3 and None not in buckets and buckets[0] == buckets[2] != buckets[1]:
        shapes.add("bucket change")
    return shapes


def test_the_strategies_draw_idle_steps_and_bucket_changes():
    seen: set[str] = set()

    @settings(max_examples=60, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    @given(case=cases())
    def collect(case):
        seen.update(_shapes(case))

    collect()
    assert seen == {"idle step", "bucket change"}


def test_a_replay_whose_padded_rows_hold_an_earlier_steps_values_is_stale_and_one_padded_afresh_is_not():
    fresh = freshness_oracle(judged([GraphReplay(bucket=4, tokens=3)], [GraphReplay(bucket=12, tokens=9)]))
    kept = freshness_oracle(judged([GraphReplay(bucket=12, tokens=10)],
                                   [GraphReplay(bucket=4, tokens=3, stale_padded_rows=1)]))
    assert fresh == []
    assert [(f.kind, f.batch, f.details) for f in kept] == [("stale-padding", 1, {"bucket": 4, "tokens": 3})]
    assert "1 of its 1 padded rows" in kept[0].message


def test_a_draft_extend_replay_whose_padded_requests_hold_a_larger_draft_extends_rows_is_stale():
    fresh = freshness_oracle(judged([DraftGraphReplay(bucket=10, requests=10)],
                                    [DraftGraphReplay(bucket=10, requests=9)]))
    kept = freshness_oracle(judged([DraftGraphReplay(bucket=12, requests=11)],
                                   [DraftGraphReplay(bucket=10, requests=9, stale_padded_requests=1)]))
    assert fresh == []
    assert [(f.kind, f.batch, f.details) for f in kept] == [("stale-padding", 1, {"bucket": 10, "requests": 9})]
    assert "1 of its 1 padded requests" in kept[0].message and "reserved row 0" in kept[0].message
