"""The nightly job: its example database replays a drawn failure; its steps and exit codes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.campaign import run_campaign
from harness.errors import InvalidArgument
from harness.mutants.corpus import mutant_target
from harness.nightly import Step, parse_skip, plan, run_steps

PROJECT = Path(__file__).resolve().parents[1]


def test_a_failure_drawn_by_a_nightly_replays_from_the_database_it_left(tmp_path):
    db = tmp_path / "examples"
    target = mutant_target("scheduler_no_wait")
    first = run_campaign(target, profile="dev", examples=60, database_dir=db, seeds=False, mutant="scheduler_no_wait",
                         shrink=False)
    assert first.findings and any(db.rglob("*")), "the drawn failure was saved"
    again = run_campaign(target, profile="dev", examples=60, database_dir=db, seeds=False, from_db=True,
                         mutant="scheduler_no_wait", shrink=False)
    assert again.findings and again.first_detection_examples == 1


def test_from_db_needs_a_profile_that_keeps_a_database(tmp_path):
    with pytest.raises(InvalidArgument, match="keeps no example database"):
        run_campaign(mutant_target("scheduler_no_wait"), profile="ci", database_dir=tmp_path, from_db=True)


def test_the_plan_covers_every_step_into_one_folder(tmp_path):
    steps = plan(tmp_path, device="cuda", examples=None, workers="auto", semantics="0.5.23", skip=frozenset())
    assert [s.name for s in steps] == ["pytest", "campaign", "mutants", "sanitize"]
    assert all(str(tmp_path) in " ".join(s.command) for s in steps)
    assert "--profile" in steps[1].command and "nightly" in steps[1].command


@pytest.mark.parametrize("argv, needle", [
    (["--skip", "fuzz"], "--skip: unknown step(s) fuzz"),
    (["--workers", "two"], "--workers='two': auto or a number of workers > 0"),
    (["--device", "tpu"], "--device='tpu' is not one of: cuda, cpu"),
    (["--examples", "0"], "--examples=0: must be >= 1"),
])
def test_bad_nightly_flags_exit_2_naming_the_flag(tmp_path, capsys, argv, needle):
    from harness.cli import main

    assert main(["nightly", "--report-dir", str(tmp_path), *argv]) == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "nightly.json").exists()


def test_unknown_steps_are_refused():
    with pytest.raises(InvalidArgument, match="allowed: pytest, campaign, mutants, sanitize"):
        parse_skip("pytest,fuzz")


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
    pytest_step = plan(report, device="cpu", examples=None, workers="auto", semantics="0.5.23",
                       skip=frozenset())[0]
    python, m, pytest_module, *options = pytest_step.command
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    done = subprocess.run([python, m, pytest_module, "-p", "xdist.plugin", *options, "-n", "0", "--collect-only"],
                          cwd=PROJECT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "tests/test_nightly.py::" in done.stdout
