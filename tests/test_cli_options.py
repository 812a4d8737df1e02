"""The command line's own contract: --help states defaults, pyproject defaults, the overwrite refusal,
progress lines off a terminal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import build_parser, main

PROJECT = Path(__file__).resolve().parents[1]
SMALL = ["run", "--device", "cpu", "--examples", "4"]


def harness(*args, cwd=None):
    """`python -m harness` of this checkout in a child whose stderr is a pipe, not a terminal (as in a CI log)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600, env=env)


def subparsers():
    action = next(a for a in build_parser()._actions if a.dest == "command")
    return action.choices


@pytest.mark.parametrize("command", sorted(subparsers()))
def test_help_states_every_options_default(command):
    """Once: "(default: None)" on required options, "(default: reference) (default: reference)", "(default: [])"."""
    parser = subparsers()[command]
    formatter = parser.formatter_class(prog=parser.prog)
    for action in parser._actions:
        if action.dest == "help" or not action.option_strings:
            continue
        assert action.help, f"{command} {action.option_strings}: no help text"
        shown = formatter._get_help_string(action)
        if action.required:
            assert shown.endswith(" (required)") and "default" not in shown, f"{command} {action.dest}: {shown}"
        elif action.default in (None, []):
            assert "none given: " in shown and "%(default)" not in shown, f"{command} {action.dest}: {shown}"
        else:
            assert shown.count("(default:") == 1, f"{command} {action.dest}: {shown}"
    text = " ".join(parser.format_help().split())
    assert "(default: None)" not in text and "(default: [])" not in text
    if command == "run":
        text = " ".join(parser.format_help().split())
        for shown in ("(default: ci)", "(default: 0.5.23)", "(default: harness-report)", "(default: 1/1)",
                      "(default: 1)", "(default: 10.0)"):
            assert shown in text


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["nightly", "--help"], ["--version"],
                                  ["run", "--examples", "0"], ["replay"], ["sanitize", "--tool", "nope"]])
def test_help_version_and_usage_errors_do_not_load_torch(argv):
    """Every call, --help included, once took about 4 s: the torch import."""
    probe = "import sys\nfrom harness.cli import main\nprint('exit', main(sys.argv[1:]), 'torch loaded:', 'torch' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, env=env, timeout=300)
    assert "torch loaded: False" in done.stdout, done.stdout + done.stderr
    assert ("exit 0" if argv[-1] in ("--help", "--version") else "exit 2") in done.stdout, done.stdout + done.stderr


def test_importing_the_error_types_loads_no_floor_above_them():
    """Every module of the harness imports `harness.errors` first, which runs `harness/__init__.py`: the
    package's public names (the campaign among them) must load on first use, not then (DESIGN.md, "Layers")."""
    probe = "import sys, harness.errors\nprint(sorted(m for m in sys.modules if m.split('.')[0] == 'harness'))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
    assert done.stdout.strip() == "['harness', 'harness.errors']", done.stdout + done.stderr


def test_version_names_the_harness():
    done = harness("--version")
    assert done.returncode == 0 and done.stdout.startswith("python -m harness "), done.stdout + done.stderr


def test_pyproject_defaults_apply_and_the_command_line_wins(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.dsv4-harness]\nsemantics = "pr"\nprofile = "dev"\n'
                                             'report-dir = "from-pyproject"\n')
    (tmp_path / "sub").mkdir()
    done = harness(*SMALL, "-q", cwd=tmp_path / "sub")  # found from a folder below, as pytest finds its own
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "sub" / "from-pyproject" / "summary.json").read_text())
    assert (summary["semantics"], summary["profile"]) == ("pr", "dev")
    help_text = harness("run", "--help", cwd=tmp_path).stdout
    assert "(default: pr)" in help_text and "(default: from-pyproject)" in help_text
    won = harness(*SMALL, "-q", "--semantics", "0.5.23", "--report-dir", "cli", cwd=tmp_path)
    assert won.returncode == 0, won.stderr
    assert json.loads((tmp_path / "cli" / "summary.json").read_text())["semantics"] == "0.5.23"


@pytest.mark.parametrize("table, needle", [
    ('semantics = "0.6"', "[tool.dsv4-harness] semantics = '0.6' is not one of: pr, 0.5.23"),
    ('profile = "weekly"', "[tool.dsv4-harness] profile = 'weekly' is not one of: dev, ci, nightly"),
    ('target = "nonsense"', "[tool.dsv4-harness] target = 'nonsense' is not one of: reference, sglang, MODULE:FACTORY"),
    ('report-dir = 3', "[tool.dsv4-harness] report-dir = 3: must be a non-empty string"),
    ('reportdir = "x"', "unknown key(s) reportdir; allowed: target, semantics, profile, report-dir"),
])
def test_a_bad_pyproject_value_exits_2_naming_the_key(tmp_path, monkeypatch, capsys, table, needle):
    (tmp_path / "pyproject.toml").write_text(f"[tool.dsv4-harness]\n{table}\n")
    monkeypatch.chdir(tmp_path)
    assert main(SMALL) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
    assert not (tmp_path / "harness-report").exists()


def test_a_folder_holding_another_run_is_refused_unless_overwrite(tmp_path, capsys):
    assert main([*SMALL, "-q", "--report-dir", str(tmp_path)]) == 0
    first = (tmp_path / "summary.json").read_text()
    capsys.readouterr()
    assert main([*SMALL, "-q", "--seed", "3", "--report-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"--report-dir {tmp_path}: the folder holds another run's report (summary.json)" in err
    assert "--overwrite" in err and (tmp_path / "summary.json").read_text() == first
    (tmp_path / "junit-pytest.xml").write_text('<testsuite name="pytest" tests="1"><testcase name="t"/></testsuite>')
    assert main([*SMALL, "-q", "--seed", "3", "--overwrite", "--report-dir", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "summary.json").read_text())["seed"] == 3
    assert (tmp_path / "junit-pytest.xml").is_file()  # another step's file, kept
    assert not [p for p in tmp_path.parent.iterdir() if p.name.startswith(f".{tmp_path.name}.")], "staging left"


def test_mutants_refuses_a_folder_holding_a_kill_table(tmp_path, capsys):
    (tmp_path / "mutants.json").write_text("[]")
    assert main(["mutants", "--examples", "1", "--report-dir", str(tmp_path)]) == 2
    assert "holds another run's report (mutants.json)" in capsys.readouterr().err


def test_off_a_terminal_a_progress_line_is_plain_with_cases_rate_eta_and_findings(tmp_path):
    normal = harness(*SMALL, "--progress-every", "0", "--report-dir", str(tmp_path))
    lines = [line for line in normal.stderr.splitlines() if line.startswith("campaign: ")]
    assert len(lines) == 4, normal.stderr
    assert lines[-1].startswith("campaign: 4/4 cases, ") and "cases/s, ETA " in lines[-1]
    assert lines[-1].endswith("0 failure(s) so far") and "\x1b[" not in normal.stderr  # no terminal codes


def test_q_prints_no_progress_and_v_a_line_per_case(tmp_path):
    quiet = harness(*SMALL, "-q", "--progress-every", "0", "--report-dir", str(tmp_path / "q"))
    assert "campaign: " not in quiet.stderr and "4 cases on cpu" in quiet.stdout
    verbose = harness(*SMALL, "-v", "--report-dir", str(tmp_path / "v"))
    assert "campaign: case 1 clean: " in verbose.stderr


def test_the_progress_line_counts_the_failures_so_far(tmp_path):
    found = harness("run", "--device", "cpu", "--examples", "20", "--mutant", "scheduler_no_wait", "--no-shrink",
                    "--progress-every", "0", "--report-dir", str(tmp_path))
    assert found.returncode == 1 and "1 failure(s) so far" in found.stderr


def test_with_keep_going_the_progress_and_the_end_count_the_same_failures(tmp_path):
    """It once said "13 finding(s) so far" (failing cases), then "7 finding(s)" at the end."""
    found = harness("run", "--device", "cpu", "--profile", "dev", "--seed", "1", "--examples", "60", "--no-seeds",
                    "--mutant", "scheduler_no_wait", "--keep-going", "3", "--no-shrink", "--progress-every", "0",
                    "--report-dir", str(tmp_path))
    assert found.returncode == 1, found.stdout + found.stderr
    last = [line for line in found.stderr.splitlines() if line.startswith("campaign: ")][-1]
    so_far = int(last.rsplit(", ", 1)[1].split()[0])
    failures = len({f["replay"] for f in json.loads((tmp_path / "summary.json").read_text())["findings"]})
    assert so_far == failures > 1 and f": {failures} failure(s), " in found.stdout, (last, found.stdout)


def test_the_default_interval_is_ten_seconds():
    run = subparsers()["run"]
    assert next(a for a in run._actions if a.dest == "progress_every").default == 10.0


def test_without_is_checked_before_work_and_recorded_in_the_summary(tmp_path, capsys):
    assert main(["run", "--device", "cpu", "--examples", "2", "--without", "hicache", "--report-dir",
                 str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert "hicache is not a gate switch or a path under one; allowed: SGLANG_FORCE_COARSE_WAR_BARRIER" in err
    assert err.rstrip().endswith("lmcache, hisparse_sparse_prefill")
    assert not (tmp_path / "bad").exists()
    assert main([*SMALL, "--without", "lmcache,cp_active", "--report-dir", str(tmp_path / "r")]) == 0
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["without"] == ["cp_active", "lmcache"]
    assert main(["report", str(tmp_path / "r")]) == 0


@pytest.mark.parametrize("argv, needle", [
    (["sanitize", "--timeout", "0"], "argument --timeout: 0: a time limit must be more than 0 seconds"),
    (["nightly", "--skip", "pytest,fuzz"], "argument --skip: unknown fuzz; allowed: pytest, campaign, mutants, sanitize"),
    (["nightly", "--workers", "0"], "argument --workers: '0' is not a number of workers >= 1, or auto"),
])
def test_a_commands_bad_limits_are_usage_errors_from_its_parser(argv, needle, capsys):
    """Checked where the option is parsed (exit 2, the option named), not again inside the feature's code."""
    assert main(argv) == 2
    assert needle in capsys.readouterr().err
