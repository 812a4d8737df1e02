"""Isolated cases: a judged case round-trips its findings; a crash or a hang is a finding, not the end.

The crashing and hanging targets are `module:factory` targets defined here, loaded by the child.
Every child imports torch, so the tests share one runner and keep the number of children small.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest
from test_fast_path import judged_with_overlaps

from harness import cli, isolation
from harness.case import Batch, Case, Mutation, Request
from harness.engine import replay_command, run_case
from harness.errors import EnvironmentBroken, InvalidArgument
from harness.findings import Finding
from harness.isolation import IsolatedRunner, _exit_status, _serve, with_context_loss
from harness.mutants.corpus import mutant_target
from harness.overlap import BatchOverlap
from harness.targets import ReferenceTarget, Target, TargetSpec

PROJECT = Path(__file__).resolve().parents[1]
PLAIN = Case(batches=(Batch(requests=(Request(5, 3),), mutations=(Mutation("req_to_token_rewrite"),)),))


class _Target(Target):
    """A target whose session cannot even open: `action` kills or stalls the process first."""

    def __init__(self, name, action):
        self.name, self.action = name, action

    def open(self, case, device):
        self.action()
        return ReferenceTarget().open(case, device)


def segfaulting_target():
    return _Target("segfault", lambda: os.kill(os.getpid(), signal.SIGSEGV))


def failing_exit_target():
    """A process that prints a traceback, then a note after it, and exits 1 (as a CUDA failure does)."""
    def fail():
        sys.stderr.write("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
                         "RuntimeError: the planted failure\nCompile with TORCH_USE_CUDA_DSA to enable device-side "
                         "assertions.\n")
        sys.stderr.flush()
        os._exit(1)

    return _Target("exit", fail)


def hanging_target():
    return _Target("hang", lambda: time.sleep(3600))


def slow_target():
    """A case that takes 2.5 s and more: past a 2 s timeout, within the second run's 8 s."""
    return _Target("slow", lambda: time.sleep(2.5))


def device_assert_target():
    """On CUDA: an out-of-range index trips a device-side assert, which leaves the context unusable."""
    import torch

    def fault():
        table = torch.zeros(4, device="cuda")
        table[torch.tensor([1 << 20], device="cuda")] = 1.0
        torch.cuda.synchronize()

    return _Target("device-assert", fault)


@pytest.fixture(scope="module")
def runner():
    with IsolatedRunner(timeout_s=120) as shared:
        yield shared


def test_a_judged_case_round_trips_the_in_process_findings(runner):
    found = runner.run_case(PLAIN, "cpu", target_spec=TargetSpec(mutant="scheduler_no_wait"))
    here = run_case(mutant_target("scheduler_no_wait"), PLAIN, "cpu",
                    target_spec=TargetSpec(mutant="scheduler_no_wait"))
    assert found.outcome == "judged" and found.findings
    assert [asdict(f) for f in found.findings] == [asdict(f) for f in here.findings]
    assert found.replay == here.replay
    assert found.batch_overlaps() == here.batch_overlaps() == [BatchOverlap(published=True, ms=None)]
    clean = runner.run_case(PLAIN, "cpu", oracles=frozenset({"differential"}))
    assert (clean.outcome, clean.findings) == ("judged", [])
    phases = clean.phases()  # the child's phases, and the rest of the round trip
    assert phases["world"] > 0 and phases["oracles"] > 0 and phases["isolation"] >= 0
    assert abs(sum(phases.values()) - clean.seconds) < 1e-6 + 0.01 * clean.seconds


def test_the_childs_answer_carries_each_batchs_measured_overlap(monkeypatch):
    """What a CUDA child measured reaches the campaign (`harness.overlap`) as the in-process case gives it."""
    measured = judged_with_overlaps((True, 0.8), (False, -0.01), (True, None))
    monkeypatch.setattr(isolation, "run_case", lambda *args, **kwargs: measured)
    request = {"case": PLAIN.to_json(), "device": "cpu", "schedule": "adversarial", "oracles": None,
               "target_spec": TargetSpec().to_dict()}
    answer = json.loads(json.dumps(_serve(request)))
    assert answer["batch_overlaps"] == [{"published": True, "ms": 0.8}, {"published": False, "ms": -0.01},
                                        {"published": True, "ms": None}]


def test_a_replay_command_sets_the_server_settings_the_run_had_and_replays_from_a_shell(monkeypatch, tmp_path):
    """A server setting the target reads from the environment (`SERVER_ENVIRONMENT`) is the run's, not the case's:
    the replay command sets it first, and that command, run by a shell without it, finds the finding again."""
    monkeypatch.setenv("SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH", "1")
    spec = TargetSpec(mutant="scheduler_no_wait")
    found = run_case(mutant_target("scheduler_no_wait"), PLAIN, "cpu", target_spec=spec)
    assert found.findings and found.replay.startswith(
        "SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH=1 python -m harness replay --target reference"), found.replay
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT), env.get("PYTHONPATH")]))
    again = subprocess.run(found.replay.replace(" python ", f" {sys.executable} ", 1), shell=True, cwd=PROJECT,
                           env=env, capture_output=True, text=True, timeout=300, check=False)
    assert again.returncode == 1, again.stdout[-2000:] + again.stderr[-2000:]
    monkeypatch.delenv("SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH")
    assert replay_command(PLAIN, target_spec=spec, device="cpu", schedule="adversarial").startswith("python -m ")


def test_the_childs_refusals_are_the_harness_errors_they_were(runner):
    with pytest.raises(InvalidArgument, match="no module named 'no_such_module_for_isolation'"):
        runner.run_case(PLAIN, "cpu", target_spec=TargetSpec("no_such_module_for_isolation:factory"))
    with pytest.raises(EnvironmentBroken, match="cannot import 'target_needing_a_missing_package'"):
        runner.run_case(PLAIN, "cpu", target_spec=TargetSpec("target_needing_a_missing_package:factory"))


def test_the_target_spec_round_trips_through_the_childs_request_and_a_mutant_elsewhere_is_refused_first(
        runner, tmp_path, capsys):
    """The child rebuilds the very record it was sent (its replay command names the mutant); a mutant on another
    target is never a record: the command line refuses it before any work, naming its flags, and a request that
    carries one anyway is refused by the child in the library's words."""
    spec = TargetSpec(mutant="scheduler_no_wait", names=("--target", "--mutant"))
    assert TargetSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    found = runner.run_case(PLAIN, "cpu", target_spec=spec)
    assert found.outcome == "judged" and found.findings
    assert found.replay == replay_command(PLAIN, target_spec=spec, device="cpu", schedule="adversarial")
    assert "--target reference --mutant scheduler_no_wait" in found.replay
    assert cli.main(["run", "--device", "cpu", "--target", "sglang", "--mutant", "scheduler_no_wait",
                     "--report-dir", str(tmp_path / "r")]) == 2
    assert "--mutant applies to --target reference only, not 'sglang'" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
    request = {"case": PLAIN.to_json(), "device": "cpu", "schedule": "adversarial", "oracles": None,
               "target_spec": {"spec": "sglang", "mutant": "scheduler_no_wait"}}
    assert _serve(request) == {"error": {"type": "InvalidArgument",
                                         "message": "mutant applies to target reference only, not 'sglang'"}}


def test_a_segfault_is_a_crash_finding_with_its_replay_and_the_next_case_still_runs(runner):
    spec = f"{__name__}:segfaulting_target"
    crashed = runner.run_case(PLAIN, "cpu", target_spec=TargetSpec(spec), schedule="random:7")
    assert crashed.outcome == "crash" and len(crashed.findings) == 1
    finding = crashed.findings[0]
    assert (finding.oracle, finding.kind) == ("execution", "crash")
    assert "died of SIGSEGV (signal 11)" in finding.message and "Segmentation fault" in finding.message
    assert crashed.replay == replay_command(PLAIN, target_spec=TargetSpec(spec), device="cpu", schedule="random:7")
    after = runner.run_case(PLAIN, "cpu")
    assert (after.outcome, after.findings) == ("judged", [])


def test_a_crash_names_its_error_before_the_stderr_tail(runner):
    crashed = runner.run_case(PLAIN, "cpu", target_spec=TargetSpec(f"{__name__}:failing_exit_target"))
    finding = crashed.findings[0]
    assert finding.message.startswith("the case's process exited with status 1: RuntimeError: the planted failure;")
    assert finding.details["error"] == "RuntimeError: the planted failure"


def test_a_hang_is_killed_and_becomes_a_hang_finding(runner):
    started = time.perf_counter()
    hung = runner.run_case(PLAIN, "cpu", target_spec=TargetSpec(f"{__name__}:hanging_target"), timeout_s=1.0)
    assert time.perf_counter() - started < 30
    assert hung.outcome == "hang" and [(f.oracle, f.kind) for f in hung.findings] == [("execution", "hang")]
    assert "did not finish within 1s, nor within 4s on a second run; its process was killed" in hung.findings[0].message
    assert "--target" in hung.replay and "hanging_target" in hung.replay


def test_a_slow_case_past_its_timeout_is_judged_on_its_second_run_not_reported_hung(runner):
    """A slow case is not a hang: a campaign of 0.5.22 on two cores reported a 12,000-token case `execution/hang`
    at 120 s, which finishes clean in 163 s alone (BENCHMARKS.md, section 27)."""
    slow = runner.run_case(PLAIN, "cpu", target_spec=TargetSpec(f"{__name__}:slow_target"), timeout_s=2.0)
    assert slow.outcome == "judged" and slow.findings == [], [f.message for f in slow.findings]
    assert slow.seconds >= 2.0 + 2.5  # the first run's timeout, then the second run


def test_exit_statuses_name_the_signal_or_the_code():
    assert _exit_status(-signal.SIGSEGV) == "died of SIGSEGV (signal 11)"
    assert _exit_status(139) == "exited with status 139"
    assert _exit_status(0) == "exited with status 0 without answering"


def test_a_bad_timeout_is_refused():
    with pytest.raises(InvalidArgument, match="timeout_s"):
        IsolatedRunner(timeout_s=0)


@pytest.mark.gpu
def test_on_cuda_a_context_killing_case_is_a_crash_and_the_next_case_runs_clean(runner):
    crashed = runner.run_case(PLAIN, "cuda", target_spec=TargetSpec(f"{__name__}:device_assert_target"))
    assert crashed.outcome == "crash"
    lost = [f for f in crashed.findings if f.oracle == "execution"]  # one finding: the engine's, naming the crash
    assert [f.kind for f in lost] == ["context-lost"] and "device-side assert" in lost[0].message
    clean = runner.run_case(PLAIN, "cuda")
    assert (clean.outcome, clean.findings) == ("judged", [])
    caught = runner.run_case(PLAIN, "cuda", target_spec=TargetSpec(mutant="scheduler_no_wait"))
    assert caught.outcome == "judged" and caught.findings


def test_a_lost_context_is_one_finding_where_the_engine_named_it_and_a_crash_finding_where_nothing_did():
    lost = "CUDA error: device-side assert triggered"
    engine_said = [Finding("execution", "context-lost", "the overlapped run raised ...", 0)]
    assert with_context_loss(engine_said, lost) == engine_said
    race = [Finding("happens-before", "unordered-access", "a race", 0)]
    added = with_context_loss(race, lost)
    assert added[:1] == race and (added[1].oracle, added[1].kind) == ("execution", "crash")
    assert added[1].message == f"the case left the CUDA context unusable: {lost}"
