"""The fast-path oracle: the tracker's timeline, and each way of losing the overlap on a planted bug, on both
semantics; quiet on the clean reference and where the coarse barrier is asked for."""

from __future__ import annotations

import argparse
import json

import pytest

from harness import overlap
from harness.campaign import CampaignConfig, CampaignResult
from harness.case import Batch, Case, Flags, Mutation, Request
from harness.commands.run import _print_result
from harness.engine import run_case
from harness.findings import CaseResult, RunRecord
from harness.hb import Checkpoint, HappensBefore, Issued, Recorded
from harness.model.enums import SpeculativeAlgorithm
from harness.mutants.corpus import mutant_target
from harness.oracles.fast_path import fast_path_oracle
from harness.oracles.registry import Judged
from harness.overlap import BatchOverlap, FastPathOverlap, describe
from harness.probe import Publish
from harness.targets import ReferenceTarget
from reports.schema import SUMMARY, check_written

ONLY = frozenset({"fast-path"})


def publishing_case(semantics: str, *, graph: bool = False, **flags) -> Case:
    """One batch the design says publishes: plain EXTEND on 0.5.23, DFLASH with the flag on the PR-era form."""
    spec = SpeculativeAlgorithm.DFLASH if semantics == "pr" else SpeculativeAlgorithm.NONE
    return Case(semantics=semantics, spec=spec, flags=Flags(SGLANG_ENABLE_PREFILL_WAR_READ_DONE=True, **flags),
                batches=(Batch(requests=(Request(5, 3), Request(0, 2)), graph=graph,
                               mutations=(Mutation("req_to_token_rewrite"),)),))


def test_the_timeline_holds_launches_records_and_checkpoints_in_issue_order():
    hb = HappensBefore()
    hb.launch(1, "read", reads={"req_to_token": None})
    hb.record(7, 1)
    hb.launch(1, "layer", writes={"swa_kv[0]": None})
    hb.checkpoint(2)
    hb.wait(2, 7)
    hb.checkpoint(2)
    timeline = hb.take_timeline()
    assert [type(e) for e in timeline] == [Issued, Recorded, Issued, Checkpoint, Checkpoint]
    assert timeline[1].clock == {1: 1} and timeline[2].buffers == frozenset({"swa_kv[0]"})
    assert timeline[3].clock.get(1, 0) == 0 and timeline[4].clock[1] == 1  # the wait ordered it after the record
    assert hb.take_timeline() == []


@pytest.mark.parametrize("semantics", ["0.5.23", "pr"])
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_the_clean_reference_keeps_its_fast_path(semantics, graph):
    assert run_case(ReferenceTarget(), publishing_case(semantics, graph=graph)).findings == []


@pytest.mark.parametrize("semantics", ["0.5.23", "pr"])
@pytest.mark.parametrize("mutant,cause", [("event_after_layers", "event-after-layers"),
                                          ("barrier_ignores_event", "barrier-waits-past-event"),
                                          ("barrier_waits_forward_after_publish", "barrier-waits-past-event")])
def test_each_lost_fast_path_is_a_performance_finding_naming_its_cause(semantics, mutant, cause):
    case = publishing_case(semantics)
    findings = run_case(mutant_target(mutant), case).findings
    assert [(f.oracle, f.kind, f.severity, f.details["cause"]) for f in findings] == [
        ("fast-path", "missed-fast-path", "performance", cause)]


def test_a_scheduler_that_does_not_wait_on_the_published_event_is_a_correctness_finding():
    findings = run_case(mutant_target("scheduler_no_wait"), publishing_case("0.5.23"), oracles=ONLY).findings
    assert [(f.kind, f.severity) for f in findings] == [("unawaited-event", "correctness")]


def test_the_coarse_barrier_asked_for_is_no_lost_fast_path():
    """PR-era releases record the event under SGLANG_FORCE_COARSE_WAR_BARRIER, and the scheduler waits for the
    whole forward: what the flag asks for."""
    case = publishing_case("pr", SGLANG_FORCE_COARSE_WAR_BARRIER=True)
    result = run_case(ReferenceTarget(), case)
    assert any(isinstance(r, Publish) for r in result.overlapped.notes[0]) and result.findings == []


def test_a_publishing_batch_whose_result_the_scheduler_never_took_is_reported():
    case = publishing_case("0.5.23")
    run = run_case(ReferenceTarget(), case).overlapped
    run.timeline[0] = [e for e in run.timeline[0] if not isinstance(e, Checkpoint)]
    findings = fast_path_oracle(Judged(case, run, RunRecord()))
    assert [f.kind for f in findings] == ["scheduler-never-ran"]


def test_the_simulator_measures_no_overlap_one_entry_per_batch():
    """The overlap in time (`RunRecord.overlap_ms`) is a real GPU's: the simulator has no clock, and says so with
    one None per batch run, never a made-up figure."""
    result = run_case(ReferenceTarget(), publishing_case("0.5.23"), "cpu")
    assert result.overlapped.overlap_ms == [None] and result.barriered.overlap_ms == [None]


def judged_with_overlaps(*batches: tuple[bool, float | None]) -> CaseResult:
    """A judged case whose overlapped run measured `batches`, (published, ms) each, as a CUDA run records them:
    a `Publish` note where the target published, the engine's `overlap_ms` beside it."""
    run = RunRecord(notes=[[Publish("forward", 7)] if published else [] for published, _ in batches],
                    overlap_ms=[ms for _, ms in batches])
    return CaseResult(publishing_case("0.5.23"), [], run, RunRecord(), 0.1)


def test_a_cuda_campaign_tallies_each_batchs_overlap_by_whether_its_target_published():
    """Issue 30's figure: the median and the overlapped count are of the publishing batches' values, the others are
    their control, a batch whose run crashed there is judged but not measured, and summary.json holds it validly."""
    result = CampaignResult("reference", "cuda", "0.5.23", None, "ci")
    result.add_phases(judged_with_overlaps((True, 0.8), (False, -0.01), (True, 0.04)))
    result.add_phases(judged_with_overlaps((True, 0.5), (True, None)))
    tally = result.summary()["fast_path_overlap"]
    assert tally == {"overlapped_above_ms": 0.05,
                     "publishing": {"batches": 4, "measured": 3, "overlapped": 2, "min_ms": 0.04, "median_ms": 0.5,
                                    "max_ms": 0.8, "values_ms": [0.8, 0.04, 0.5]},
                     "not_publishing": {"batches": 1, "measured": 1, "overlapped": 0, "min_ms": -0.01,
                                        "median_ms": -0.01, "max_ms": -0.01, "values_ms": [-0.01]}}
    check_written(SUMMARY, json.dumps(result.summary()))
    assert describe(tally) == (
        "the scheduler started 0.500 ms before the forward ended on a publishing batch (median; min 0.040, max 0.800 "
        "ms before the end), more than 0.05 ms before on 2 of 3 measured (4 judged) publishing batches and on 0 of 1 "
        "that did not publish")


def test_the_simulator_campaign_says_the_overlap_was_not_measured_rather_than_zero():
    """The simulator's run notes the publish but measures nothing: the tally is the reason, not a row of zeros."""
    judged = run_case(ReferenceTarget(), publishing_case("0.5.23"), "cpu")
    assert judged.batch_overlaps() == [BatchOverlap(published=True, ms=None)]
    result = CampaignResult("reference", "cpu", "0.5.23", None, "ci")
    result.add_phases(judged)
    tally = result.summary()["fast_path_overlap"]
    assert tally == {"unmeasured": "the device has no clock: the simulator orders the streams, it does not time "
                                   "them (measured on CUDA)"}
    check_written(SUMMARY, json.dumps(result.summary()))
    assert describe(tally).startswith("not measured: the device has no clock")
    assert "crashed" in FastPathOverlap().to_dict(timed=True)["unmeasured"]  # CUDA, nothing measured: another reason


def test_a_group_keeps_its_first_values_for_the_median_and_its_counts_and_extremes_exact(monkeypatch):
    monkeypatch.setattr(overlap, "KEPT_VALUES", 3)
    tally = FastPathOverlap()
    tally.add(BatchOverlap(True, ms) for ms in (0.3, 0.1, 0.2, 0.9, -0.4))
    publishing = tally.to_dict(timed=True)["publishing"]
    assert publishing == {"batches": 5, "measured": 5, "overlapped": 4, "min_ms": -0.4, "median_ms": 0.2,
                          "max_ms": 0.9, "values_ms": [0.3, 0.1, 0.2]}
    assert "(median of the first 3;" in describe(tally.to_dict(timed=True))


def test_a_cuda_run_prints_the_fast_path_in_time_and_a_simulator_run_does_not(tmp_path, capsys):
    args = argparse.Namespace(quiet=False, shard=None, from_db=False)
    for device, batch in (("cuda", (True, 0.8)), ("cpu", (True, None))):
        result = CampaignResult("reference", device, "0.5.23", None, "ci")
        result.add_phases(judged_with_overlaps(batch))
        _print_result(args, result.summary(), config=CampaignConfig(device=device), target=ReferenceTarget(),
                      report_dir=tmp_path)
        lines = [line for line in capsys.readouterr().out.splitlines() if "fast path" in line]
        assert lines == (["  fast path: the scheduler started 0.800 ms before the forward ended on a publishing batch "
                          "(median; min 0.800, max 0.800 ms before the end), more than 0.05 ms before on 1 of 1 "
                          "publishing batches and on 0 of 0 that did not publish"] if device == "cuda" else []), device
