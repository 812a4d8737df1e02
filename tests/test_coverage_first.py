"""Coverage-first streams (issue 30): the first drawn cases of a campaign reach every value of the coverage
table, each value keeps the case that first reached it, and a value the campaign cannot draw is named
unreachable with the reason."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from typing import get_args

import pytest
from hypothesis import HealthCheck, given, settings

from harness.campaign import StreamPhase, case_digest, run_campaign
from harness.case import Batch, Request
from harness.coverage import (CARRY_ORDERS, FOLLOWS_LARGER_DRAFT_REPLAY, FOLLOWS_LARGER_REPLAY, FOLLOWS_PLANNED,
                             FOLLOWS_PUBLISH, HISPARSE_READS, VALUES, Coverage, Value, describe, merge_tables, values)
from harness.covering import CoverageFirst, covering_cases, padded_counts_below, unreachable
from harness.model.enums import ForwardMode, SpeculativeAlgorithm
from harness.model.runners import generate_speculative_cuda_graph_batch_sizes
from harness.mutants.corpus import mutant_target
from harness.sharding import Shard
from harness.strategies import PROFILE_BUDGETS, seed_cases
from harness.targets import ReferenceTarget, TargetSpec
from reports.schema import StreamPhaseName
from reports.merge import merge_summaries

RESTRICTED = dict(contracts=("bcg",), dims=(("page_size", 256),))  # a release with the breakable graph only


def _aimed(value, semantics: str, **target):
    return covering_cases(semantics, budget=PROFILE_BUDGETS["ci"], reachable=(value,), **target)


@pytest.mark.parametrize("value", VALUES, ids=str)
@pytest.mark.parametrize("semantics", ["0.5.23", "pr"])
def test_every_value_has_cases_that_reach_it_valid_and_within_the_budget(value, semantics):
    # what the coverage-first phase counts on: a case aimed at a value has it, for a restricted target too
    targets = [{}] + ([RESTRICTED] if value not in unreachable(without=frozenset(), cannot_run=frozenset(),
                                                                 contracts=RESTRICTED["contracts"]) else [])

    for target in targets:
        @settings(max_examples=8, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(case=_aimed(value, semantics, **target))
        def reaches(case):
            case.validate()
            assert value in values(case)
            assert case.graph_contract in target.get("contracts", ("fresh", "bcg"))
            for batch in case.batches:
                assert batch.num_tokens * len(case.dims.layer_ratios) * case.dims.heads <= PROFILE_BUDGETS["ci"] + 1

        reaches()


@pytest.mark.parametrize("seeds", [True, False], ids=["seeds", "no-seeds"])
def test_run_examples_60_reaches_every_value_of_the_coverage_table(tmp_path, seeds):
    # the check, on the reference and the CPU; about 40 s a run on a quiet machine (BENCHMARKS section 14)
    out = subprocess.run([sys.executable, "-m", "harness", "run", "--device", "cpu", "--examples", "60",
                          *([] if seeds else ["--no-seeds"]), "--report-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    coverage = json.loads((tmp_path / "summary.json").read_text())["coverage"]
    assert coverage["unreached"] == {} and coverage["unreachable"] == {}
    assert all(count for counts in coverage["dimensions"].values() for count in counts.values())
    last = max(place for places in coverage["first_reached"].values() for place in places.values())
    assert coverage["reached_by"] == last <= 60
    assert f"  coverage: every value reached by case {last}\n" in out.stdout
    page = (tmp_path / "index.html").read_text()
    assert f"the last first at case {last}" in page and "(case 1)" in page


def test_first_reached_is_the_place_in_the_stream_and_merges_across_shards_to_the_whole_campaigns(tmp_path):
    options = dict(examples=14, seed=4, seeds=False, shrink=False)
    whole = run_campaign(ReferenceTarget(), **options).summary()
    parts = [run_campaign(ReferenceTarget(), shard=Shard(k, 2), **options).summary() for k in (1, 2)]
    merged = merge_summaries([(f"shard{k}", part) for k, part in enumerate(parts, 1)])
    assert merged["coverage"]["first_reached"] == whole["coverage"]["first_reached"]
    assert merged["coverage"]["dimensions"] == whole["coverage"]["dimensions"]
    # each shard numbers the cases of the one stream: a value its part reached first keeps the stream's place
    firsts = [p["coverage"]["first_reached"] for p in parts]
    for name, places in whole["coverage"]["first_reached"].items():
        for value, place in places.items():
            assert place == min(filter(None, (f[name][value] for f in firsts)), default=None)
    assert whole["coverage"]["first_reached"]["mode"]["EXTEND"] == 1


def test_first_reached_keeps_the_first_place_and_a_database_replay_reaches_nothing_first():
    coverage = Coverage()
    extend, replayed = seed_cases("0.5.23")[:2]
    coverage.add(replayed)  # replayed from the example database: before the stream, no place in it
    coverage.add(extend, 0)
    coverage.add(replayed, 1)
    coverage.add(extend, 2)
    table = coverage.to_dict()
    assert table["first_reached"]["graph"] == {"eager": 1, "first graph replay": 2, "reused bucket": None}
    once = Coverage()
    once.add(replayed)
    assert table["dimensions"]["graph"]["first graph replay"] == 2 * once.counts["graph"]["first graph replay"]  # counted
    assert merge_tables([table, {**table, "first_reached": {}}])["first_reached"] == table["first_reached"]


def test_a_kept_case_run_again_is_kept_again_and_one_that_adds_nothing_is_not():
    # hypothesis runs a draw that raised a second time: rejecting it then would hide the error behind a FlakyFailure
    extend = seed_cases("0.5.23")[0]
    phase = CoverageFirst(reachable=frozenset(values(extend)))
    assert phase.keeps(extend, "adversarial") and phase.keeps(extend, "adversarial") and phase.cases == 1
    assert not phase.keeps(extend, "forced")  # the same values under another schedule: nothing new
    # judged (it raised nothing) and met again, as another value's aim may draw it: not a second place in the stream
    phase.mark_judged(extend, "adversarial")
    assert not phase.keeps(extend, "adversarial") and phase.cases == 1


def test_every_case_of_the_coverage_first_phase_is_counted_once():
    """A kept case drawn again by another value's aim was counted as a second case of the stream, and every later
    case's phase was then off by one (seen on the stream of the table with the HiSparse c4 reads: 3 coverage-first
    cases logged of 39 kept, the first of them twice)."""
    log = run_campaign(ReferenceTarget(), examples=40, seed=3, seeds=False).cases_log
    assert len({e["case"] for e in log}) == len(log) == 40
    first = [e["i"] for e in log if e["phase"] is StreamPhase.COVERAGE_FIRST]
    assert first == list(range(1, len(first) + 1)) and len(first) > 3


def test_a_replay_after_its_buckets_sparse_replay_is_a_carry_value_of_its_contract():
    """The chunk cache a replay's captured metadata may keep: the value names whether the bucket's last (sparse)
    replay came just before or before another bucket's, under the case's contract; a dense first replay keeps none."""
    extend, _ = seed_cases("0.5.23")[:2]
    sparse = dataclasses.replace(extend.flags, SGLANG_OPT_FLASHMLA_SPARSE_PREFILL=True)
    small, other = Batch(requests=(Request(0, 2),), graph=True), Batch(requests=(Request(0, 5),), graph=True)

    def carried(flags, contract, *batches):
        case = dataclasses.replace(extend, flags=flags, graph_contract=contract, batches=batches)
        return {value.value for value in values(case) if value.dimension == "carry"}

    assert carried(sparse, "bcg", small, small) == {f"bcg: {CARRY_ORDERS[0]}"}
    assert carried(sparse, "fresh", small, other, small) == {f"fresh: {CARRY_ORDERS[1]}"}
    dense = dataclasses.replace(sparse, SGLANG_OPT_FLASHMLA_SPARSE_PREFILL=False)
    assert carried(dense, "bcg", small, other, small) == set()
    assert carried(sparse, "bcg", small, dataclasses.replace(small, graph=False)) == set()  # eager: no replay


def test_what_a_batch_follows_a_larger_replay_a_publish_or_a_planned_batch_is_what_the_step_before_left_behind():
    """What the step before left behind: a replay's padded rows over the last prefill replay's live rows where it
    had more (whichever its bucket), unless the runner pads them afresh; not where it had fewer, not for an unpadded
    replay, not across an eager batch or a decode replay (another runner's), nor for the first replay. A batch
    that publishes nothing after one that published: the event left in the mailbox. An idle step after a batch with
    requests: that batch's metadata, unless the idle step drops it."""
    extend, _ = seed_cases("0.5.23")[:2]  # a case whose EXTEND batches publish

    def follows(*batches):
        case = dataclasses.replace(extend, batches=batches)
        return [value.value for value in values(case) if value.dimension == "follows"]

    def replay(tokens, mode=ForwardMode.EXTEND):
        return Batch(requests=(Request(0, tokens),), graph=True, mode=mode)

    eager, decode = Batch(requests=(Request(0, 3),)), Batch(requests=(Request(0, 3),), mode=ForwardMode.DECODE)
    assert follows(replay(10), replay(3)) == [FOLLOWS_LARGER_REPLAY]  # 3 pads to 4: row 3 was live
    assert follows(replay(40), replay(9)) == [FOLLOWS_LARGER_REPLAY]  # another bucket (48, then 12)
    assert follows(replay(3), replay(10)) == []  # fewer live rows before
    assert follows(replay(10), replay(8)) == []  # 8 is a bucket: no padded row
    assert follows(replay(10), eager) == []  # eager, and it publishes too
    assert follows(replay(10), replay(3, ForwardMode.DECODE)) == [FOLLOWS_PUBLISH]  # the decode runner's; quiet
    assert follows(replay(3)) == []
    assert follows(eager, decode) == [FOLLOWS_PUBLISH]
    assert follows(decode, eager) == [] and follows(decode, decode) == []
    quiet = dataclasses.replace(extend.flags, SGLANG_ENABLE_PREFILL_WAR_READ_DONE=False)
    assert values(dataclasses.replace(extend, flags=quiet, batches=(eager, decode))).isdisjoint(
        {Value("follows", FOLLOWS_PUBLISH)})  # nothing published before
    idle = Batch(mode=ForwardMode.IDLE, requests=())
    assert follows(decode, idle) == [FOLLOWS_PLANNED] and follows(eager, idle) == [FOLLOWS_PLANNED]  # idle: quiet too
    assert follows(idle, idle) == [] and follows(idle) == []
    assert padded_counts_below(5) == [2, 3] and padded_counts_below(2) == []


def test_a_draft_extend_replay_of_fewer_requests_padded_follows_the_larger_one_before_it():
    """EAGLE's draft-extend graph pads by request count (every count to 8, then every other one): a replayed verify
    or draft extend of an EAGLE-family case whose count pads, after one of more requests, has padded rows the larger
    one's requests had. Not where the count is a bucket, not after fewer, not eager, not for another algorithm, not
    for requests of several widths (no draft-extend replay follows them), nor for the first."""
    extend, _ = seed_cases("0.5.23")[:2]

    def follows(*batches, spec=SpeculativeAlgorithm.EAGLE):
        case = dataclasses.replace(extend, spec=spec, batches=batches)
        return [value.value for value in values(case) if value.dimension == "follows"]

    def drafts(count, mode=ForwardMode.DRAFT_EXTEND, graph=True, width=3):
        return Batch(mode=mode, requests=tuple(Request(i, width) for i in range(count)), graph=graph)

    assert follows(drafts(10), drafts(9)) == [FOLLOWS_LARGER_DRAFT_REPLAY]  # 9 pads to 10: row 9 was live
    assert follows(drafts(12, ForwardMode.TARGET_VERIFY), drafts(9)) == [FOLLOWS_LARGER_DRAFT_REPLAY]
    assert follows(drafts(12), drafts(3), drafts(11, ForwardMode.TARGET_VERIFY)) == [FOLLOWS_LARGER_DRAFT_REPLAY]
    assert follows(drafts(9), drafts(10)) == [] and follows(drafts(9)) == []  # fewer before; the first
    assert follows(drafts(10), drafts(8)) == []  # 8 is a bucket: no padded row
    assert follows(drafts(10), drafts(9, graph=False)) == []  # eager
    assert follows(drafts(10), drafts(9), spec=SpeculativeAlgorithm.DFLASH) == []  # no draft-extend graph
    uneven = Batch(mode=ForwardMode.DRAFT_EXTEND, requests=(Request(0, 2),) * 4 + (Request(0, 3),) * 5, graph=True)
    assert follows(drafts(10), uneven) == []
    assert generate_speculative_cuda_graph_batch_sizes(16) == [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16]


def test_a_hisparse_prefill_with_a_c4_block_is_a_c4_read_of_its_attention_path():
    """The read HiSparse moves to device slots: a prefill batch's (EXTEND or MIXED) c4 read, sparse or dense as the
    batch's attention is, where the case has a ratio-4 layer and a request has a c4 block (4 tokens); nothing
    without HiSparse, without a ratio-4 layer, without a block, or in a decode step."""
    extend, _ = seed_cases("0.5.23")[:2]
    hisparse = dataclasses.replace(extend.flags, hisparse=True, SGLANG_OPT_FLASHMLA_SPARSE_PREFILL=False)

    def reads(*batches, flags=hisparse, layers=(0, 4, 128)):
        case = dataclasses.replace(extend, flags=flags, batches=batches,
                                   dims=dataclasses.replace(extend.dims, layer_ratios=layers))
        return [value.value for value in values(case) if value.dimension == "hisparse c4 read"]

    block, short = Batch(requests=(Request(0, 1), Request(3, 1))), Batch(requests=(Request(0, 3), Request(2, 1)))
    sparse = dataclasses.replace(hisparse, SGLANG_OPT_FLASHMLA_SPARSE_PREFILL=True)
    assert reads(block) == ["dense prefill"] and reads(block, flags=sparse) == ["sparse prefill"]
    assert reads(dataclasses.replace(block, mode=ForwardMode.MIXED), flags=sparse) == ["dense prefill"]
    assert reads(short, flags=sparse) == [] and reads(block, layers=(0, 128)) == []
    assert reads(block, flags=extend.flags) == []
    assert reads(dataclasses.replace(block, mode=ForwardMode.DECODE), flags=sparse) == []


class _BreakableOnlyWithoutCp(ReferenceTarget):
    """A target like a release that replays its prefill graph under the breakable contract only and cannot run CP."""

    graph_contracts = ("bcg",)
    cannot_run = frozenset({"cp_active"})


def test_a_value_the_campaign_cannot_draw_is_named_unreachable_with_the_reason():
    result = run_campaign(_BreakableOnlyWithoutCp(), examples=45, seed=2, seeds=False, shrink=False,
                          without=frozenset({"hisparse"}))
    coverage = result.summary()["coverage"]
    assert coverage["unreachable"] == {
        "contract": {"fresh": "the target replays its prefill graph under bcg only"},
        "carry": {f"fresh: {order}": "the target replays its prefill graph under bcg only" for order in CARRY_ORDERS},
        "gate": {"cp_active": "the target cannot run cp_active", "hisparse": "--without hisparse"},
        "mutation": {"hisparse_evict": "needs hisparse: --without hisparse"},
        "hisparse c4 read": {read: "needs hisparse: --without hisparse" for read in HISPARSE_READS},
    }
    never = {(name, value) for name, reasons in coverage["unreachable"].items() for value in reasons}
    assert all(coverage["dimensions"][name][value] == 0 for name, value in never)  # no case drew one
    assert coverage["unreached"] == {} and coverage["reached_by"]  # and every other value was reached
    line = describe(coverage)
    assert line.startswith("every reachable value reached by case ")
    assert "gate cp_active (the target cannot run cp_active)" in line


def test_a_failure_in_the_coverage_first_phase_is_shrunk_by_hypothesis_with_its_replay_command():
    # EAGLE publishing is found where a case has an EAGLE-family spec: the phase aims at each (a drawn case has one
    # only where its spec is what closes publication)
    result = run_campaign(mutant_target("eagle_publishes"), examples=60, seed=1, seeds=False,
                          target_spec=TargetSpec(mutant="eagle_publishes"))
    found = result.cases_log[-1]
    assert found["phase"] == StreamPhase.COVERAGE_FIRST and found["outcome"] == "found"
    assert result.shrunk and result.findings and not result.found_on_seed
    minimal = result.minimal.case
    assert found["case"] != case_digest(minimal, "adversarial")  # hypothesis shrank it, within the phase's strategy
    assert len(minimal.batches) == 1 and minimal.batches[0].num_tokens == 1 and minimal.spec.is_eagle_family()
    assert result.minimal.replay.startswith("python -m harness replay ") and "--case '" in result.minimal.replay


def test_the_report_checks_know_every_phase_of_the_stream():
    assert get_args(StreamPhaseName) == tuple(phase.value for phase in StreamPhase)


def test_a_clean_campaign_stores_nothing_in_the_example_database(tmp_path):
    # the coverage-first phase ends without raising: hypothesis stores any example that raises, and a clean case
    # stored there was replayed by every later campaign of the folder
    result = run_campaign(ReferenceTarget(), examples=60, seed=1, seeds=False, shrink=False, database_dir=tmp_path)
    assert result.summary()["coverage"]["reached_by"] and not result.findings
    assert not [path for path in tmp_path.rglob("*") if path.is_file()]
