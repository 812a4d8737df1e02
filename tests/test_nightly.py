"""The nightly job: its example database replays a drawn failure; its steps and exit codes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.campaign import run_campaign
from harness.errors import InvalidArgument
from harness.mutants.corpus import mutant_target
from harness.nightly import Step, plan, run_steps
from harness.targets import TargetSpec
from harness.workers import cpu_cores

PROJECT = Path(__file__).resolve().parents[1]


def test_a_failure_drawn_by_a_nightly_replays_from_the_database_it_left(tmp_path):
    db = tmp_path / "examples"
    target, target_spec = mutant_target("scheduler_no_wait"), TargetSpec(mutant="scheduler_no_wait")
    first = run_campaign(target, profile="dev", examples=60, database_dir=db, seeds=False, target_spec=target_spec,
                         shrink=False)
    assert first.findings and any(db.rglob("*")), "the drawn failure was saved"
    again = run_campaign(target, profile="dev", examples=60, database_dir=db, seeds=False, from_db=True,
                         target_spec=target_spec, shrink=False)
    assert again.findings and again.first_detection_examples == 1


def test_from_db_needs_a_profile_that_keeps_a_database(tmp_path):
    with pytest.raises(InvalidArgument, match="keeps no example database"):
        run_campaign(mutant_target("scheduler_no_wait"), profile="ci", database_dir=tmp_path, from_db=True)


def test_the_plan_covers_every_step_into_one_folder(tmp_path):
    steps = plan(tmp_path, device="cuda", examples=None, workers=None, semantics="0.5.23", skip=frozenset())
    assert [s.name for s in steps] == ["pytest", "campaign", "mutants", "sanitize"]
    assert all(str(tmp_path) in " ".join(s.command) for s in steps)
    assert "--profile" in steps[1].command and "nightly" in steps[1].command


def test_the_pytest_step_runs_the_cases_against_the_target_on_every_core_sharing_the_gpu(tmp_path):
    """The user's nightly checks their SGLang: the cases against the configured target, not the
    harness's own tests (one worker per GPU left 15 of 16 cores idle, and the self-tests took most of it)."""
    pytest_step, campaign = plan(tmp_path, device="cuda", examples=None, workers=None, semantics="0.5.23",
                                 skip=frozenset(), target="sglang")[:2]
    command = pytest_step.command
    assert command[command.index("-n") + 1] == str(cpu_cores()) and "--gpu-share" in command
    assert "--harness-target=sglang" in command and command[-1] == "cases" and "tests" not in command
    assert campaign.command[campaign.command.index("--target") + 1] == "sglang"
    assert campaign.command[campaign.command.index("--workers") + 1] == "auto"  # None: the campaign's own auto
    with_self_tests, campaign = plan(tmp_path, device="cpu", examples=None, workers=3, semantics="0.5.23",
                                     skip=frozenset(), self_tests=True)[:2]
    assert with_self_tests.command[-2:] == ["cases", "tests"] and "--gpu-share" not in with_self_tests.command
    assert with_self_tests.command[with_self_tests.command.index("-n") + 1] == "3"
    assert campaign.command[campaign.command.index("--workers") + 1] == "3"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible here: the nightly would run")
def test_a_nightly_on_cuda_without_a_gpu_is_refused_before_any_step(tmp_path):
    done = subprocess.run([sys.executable, "-m", "harness", "nightly", "--report-dir", str(tmp_path / "r")],
                          cwd=PROJECT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "--device cuda: no CUDA device is visible" in done.stderr and "Traceback" not in done.stderr
    assert "[pytest]" not in done.stdout and not (tmp_path / "r").exists()


def test_a_pytest_usage_error_is_a_broken_step_not_an_interruption():
    """pytest's exit 4 is its usage error; the harness's 4 is an interruption."""
    steps = [Step("pytest", [sys.executable, "-c", "raise SystemExit(4)"])]
    assert run_steps(steps, frozenset(), log=lambda line: None) == 3 and steps[0].outcome == "broken"
    steps = [Step("pytest", [sys.executable, "-c", "raise SystemExit(2)"])]
    assert run_steps(steps, frozenset(), log=lambda line: None) == 4 and steps[0].outcome == "interrupted"


@pytest.mark.parametrize("argv, needle", [
    (["--skip", "fuzz"], "argument --skip: unknown fuzz; allowed: pytest, campaign, mutants, sanitize"),
    (["--workers", "two"], "argument --workers: 'two' is not a number of workers >= 1, or auto"),
    (["--device", "tpu"], "argument --device: 'tpu' is not one of: cuda, cpu"),
    (["--examples", "0"], "argument --examples: 0 is out of range: an integer from 1 to 1,000,000"),
    (["--target", "nonsense"], "argument --target: 'nonsense' is not one of: reference, sglang, MODULE:FACTORY"),
    # checked by the command before any step (and before --device cuda asks for a GPU), naming the flags
    (["--shard", "2/4"], "--shard=2/4 needs --seed S, the same on every host"),
    (["--shard", "5/4", "--seed", "1"], "--shard='5/4': K/N with 1 <= K <= N"),
    (["--example-db", "ftp://host/db"], "--example-db='ftp://host/db': a directory or redis://HOST:PORT"),
])
def test_bad_nightly_flags_exit_2_naming_the_flag(tmp_path, capsys, argv, needle):
    from harness.cli import main

    assert main(["nightly", "--report-dir", str(tmp_path), *argv]) == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "nightly.json").exists()


@pytest.mark.parametrize("codes, expected", [((0, 0), 0), ((0, 1), 1), ((1, 3), 3), ((2, 0), 3)])
def test_the_exit_code_is_the_worst_step(codes, expected):
    steps = [Step(f"s{i}", [sys.executable, "-c", f"raise SystemExit({code})"]) for i, code in enumerate(codes)]
    assert run_steps(steps, frozenset(), log=lambda line: None) == expected


def test_a_skipped_step_is_said_not_hidden():
    lines = []
    steps = [Step("pytest", [sys.executable, "-c", "pass"]), Step("sanitize", [sys.executable, "-c", "pass"])]
    assert run_steps(steps, frozenset({"sanitize"}), log=lines.append) == 0
    assert "[sanitize] skipped (--skip)" in lines and steps[1].outcome == "skipped"


def test_the_pytest_step_collects_this_project_from_any_report_folder(tmp_path):
    """The step's own command line, collecting only, as in a checkout that is not pip-installed (no
    entry points: conftest.py loads the plugins). A report folder taken for a test path made it the
    rootdir, so the project's conftest never loaded and its options were unknown (exit 4)."""
    report = tmp_path / "report"
    report.mkdir()  # as `nightly` makes it before the steps run; an existing path is what pytest took
    pytest_step = plan(report, device="cpu", examples=None, workers=None, semantics="0.5.23",
                       skip=frozenset())[0]
    python, m, pytest_module, *options = pytest_step.command
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    done = subprocess.run([python, m, pytest_module, "-p", "xdist.plugin", *options, "-n", "0", "--collect-only"],
                          cwd=PROJECT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "cases/test_races.py::" in done.stdout and "tests/test_nightly.py::" not in done.stdout
