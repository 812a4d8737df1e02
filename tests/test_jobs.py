"""`harness run --jobs N`: cases judged at once in N isolated children, one drawing of the stream.

The stream, the count, the first detection and the shrunk case must be those of a campaign judging
one case at a time: each test compares the two on the same seed. The children are real (each imports
torch), so the campaigns are short.
"""

from __future__ import annotations

import json
import os

import pytest

import harness.campaign as campaign_module
from harness.campaign import run_campaign
from harness.cli import main
from harness.commands.run import AUTO_JOBS_MAX, auto_jobs
from harness.errors import InvalidArgument
from harness.isolation import IsolatedPool
from harness.mutants.corpus import mutant_target
from harness.targets import ReferenceTarget, TargetSpec
from tests.test_isolation import PLAIN

ISOLATE_S = 120.0


def _stream(result) -> list[tuple]:
    return [(record["stream"], record["case"], record["outcome"]) for record in result.cases_log]


def _verdict(result) -> tuple:
    minimal = result.minimal
    return (result.cases, result.first_detection_examples, minimal.case.to_json() if minimal else None,
            sorted((f.oracle, f.kind) for f in minimal.findings) if minimal else None)


def test_a_clean_campaign_judges_the_stream_of_one_case_at_a_time():
    one = run_campaign(ReferenceTarget(), examples=24, seed=11)
    dealt = run_campaign(ReferenceTarget(), examples=24, seed=11, isolate_s=ISOLATE_S, jobs=3)
    assert _stream(dealt) == _stream(one) and dealt.cases == 24 and not dealt.findings
    assert [record["stream"] for record in dealt.cases_log] == list(range(24))
    summary = dealt.summary()
    assert summary["jobs"] == 3 and summary["time"]["campaign"] > 0
    assert summary["time"]["campaign"] <= dealt.duration_s  # this process's own time, not the children's


def test_a_failure_is_found_at_the_same_case_and_shrunk_to_the_same_case():
    target = mutant_target("threshold_off_by_one")
    options = dict(examples=200, seed=5, seeds=False, target_spec=TargetSpec(mutant="threshold_off_by_one"))
    one = run_campaign(target, **options)
    dealt = run_campaign(target, **options, isolate_s=ISOLATE_S, jobs=2)
    assert one.findings and dealt.findings
    assert _verdict(dealt) == _verdict(one)
    assert _stream(dealt) == _stream(one)
    assert dealt.shrunk and not dealt.found_on_seed


def test_keep_going_collects_the_same_failures():
    target = mutant_target("snapshot_skipped")
    options = dict(examples=40, seed=3, target_spec=TargetSpec(mutant="snapshot_skipped"), keep_going=2, shrink=False)
    one = run_campaign(target, **options)
    dealt = run_campaign(target, **options, isolate_s=ISOLATE_S, jobs=2)
    assert len(one.failures) == 2
    assert [f.case.to_json() for f in dealt.failures] == [f.case.to_json() for f in one.failures]
    assert _stream(dealt) == _stream(one)


def test_a_replay_that_misses_the_failure_says_so_and_still_shrinks(monkeypatch, capsys):
    """Planted: the replay of the stream draws another one (another seed), so it never meets the
    failing case; the campaign must say so and shrink the failure itself, never lose it."""
    parts, replayed, current = [], [], [None]  # each hypothesis test of the stream by its part; those drawn again
    seeded, hypothesis_test = campaign_module._seeded, campaign_module.Campaign.hypothesis_test

    def noting_the_part(self, *args, part: str = "", **kwargs):
        current[0] = part
        return hypothesis_test(self, *args, part=part, **kwargs)

    def other_seed_on_replay(test, seed):
        part = current[0]
        if part in parts or replayed:  # the stream drawn again: the replay
            replayed.append(part)
        parts.append(part)
        return seeded(test, seed + 1 if replayed else seed)

    monkeypatch.setattr(campaign_module.Campaign, "hypothesis_test", noting_the_part)
    monkeypatch.setattr(campaign_module, "_seeded", other_seed_on_replay)
    # a failure deep in the stream (case 37): hypothesis draws a test's simplest case first whatever the seed, so a
    # failure among the first cases is met by any replay
    target = mutant_target("cp_snapshot_global")
    dealt = run_campaign(target, examples=200, seed=5, seeds=False,
                         target_spec=TargetSpec(mutant="cp_snapshot_global"), isolate_s=ISOLATE_S, jobs=2,
                         shrink_seconds=10)
    assert replayed  # the dealt pass, then the replay
    assert dealt.findings and dealt.shrunk
    assert "did not meet its failing case" in capsys.readouterr().err


def test_a_stop_counts_the_cases_in_flight_as_one_case_at_a_time_counts_its_one():
    def stop_after(n):
        polls = []
        return lambda: "SIGINT" if polls.append(None) or len(polls) > n else None

    one = run_campaign(ReferenceTarget(), examples=40, seed=11, should_stop=stop_after(6))
    dealt = run_campaign(ReferenceTarget(), examples=40, seed=11, isolate_s=ISOLATE_S, jobs=2,
                         should_stop=stop_after(6))
    assert one.interrupted == dealt.interrupted == "SIGINT"
    assert one.cases == dealt.cases == 6
    assert _stream(dealt) == _stream(one)


def test_a_crash_in_one_child_is_that_case_finding():
    with IsolatedPool(2, timeout_s=ISOLATE_S) as pool:
        crashed = pool.submit(PLAIN, "cpu", target_spec=TargetSpec("tests.test_isolation:segfaulting_target"))
        judged = pool.submit(PLAIN, "cpu")
        assert [(f.oracle, f.kind) for f in crashed.result().findings] == [("execution", "crash")]
        assert judged.result().findings == [] and judged.result().outcome == "judged"


@pytest.mark.parametrize("argv, message", [
    (["--jobs", "0"], "argument --jobs: '0' is not a number of cases judged at once >= 1, or auto"),
    (["--jobs", "many"], "argument --jobs: 'many' is not a number"),
    (["--jobs", "2", "--isolate", "off"], "--jobs=2: cases judged at once"),
])
def test_bad_jobs_are_refused_before_any_work(tmp_path, capsys, argv, message):
    code = main(["run", "--device", "cpu", "--examples", "3", "--report-dir", str(tmp_path / "r"), *argv])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_the_pool_refuses_no_children():
    with pytest.raises(InvalidArgument, match="size=0"):
        IsolatedPool(0)


def test_jobs_reach_the_summary_of_the_run(tmp_path, capsys):
    code = main(["run", "--device", "cpu", "--examples", "6", "--seed", "1", "--jobs", "2", "-q",
                 "--report-dir", str(tmp_path / "r")])
    assert code == 0, capsys.readouterr()
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["jobs"] == 2 and summary["cases"] == 6


@pytest.mark.parametrize("device, isolate_s, cores, processes, jobs", [
    ("cuda", 120.0, 16, 1, 8),  # the H200 host: one per two cores
    ("cuda", 120.0, 64, 1, AUTO_JOBS_MAX),
    ("cuda", 120.0, 16, 8, 1),  # eight workers share the cores
    ("cuda", 120.0, 16, 2, 4),
    ("cuda", None, 16, 1, 1),  # --isolate off: no child to judge in
    ("cpu", None, 16, 1, 1),  # the forwards are the work on the CPU
])
def test_auto_jobs_follow_the_cores_each_process_has(monkeypatch, device, isolate_s, cores, processes, jobs):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert auto_jobs(device, isolate_s, processes=processes) == jobs


def test_auto_jobs_on_the_cpu_judge_in_this_process(tmp_path, capsys):
    code = main(["run", "--device", "cpu", "--examples", "3", "--seed", "1", "-q", "--report-dir", str(tmp_path / "r")])
    assert code == 0, capsys.readouterr()
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["jobs"] == 1 and "isolation" not in summary["time"]


def test_a_random_profile_gets_a_seed_recorded_so_that_the_replay_draws_the_same_stream():
    dealt = run_campaign(ReferenceTarget(), profile="dev", examples=3, isolate_s=ISOLATE_S, jobs=2)
    assert isinstance(dealt.seed, int) and dealt.summary()["seed"] == dealt.seed
