"""The main job's contract: options, exit codes, summary.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from harness import cli
from harness.commands import replay as replay_command
from harness.errors import ExitCode
from harness.targets import TargetSpec
from harness.workers import cpu_cores


PROJECT = Path(__file__).resolve().parents[1]


def harness(*args, cwd=None):
    """`python -m harness` of this checkout, from any folder (an installed copy elsewhere would come first)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600, env=env)


def test_clean_run_exits_0_and_writes_the_summary(tmp_path):
    out = harness("run", "--device", "cpu", "--examples", "10", "--report-dir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    for key in ("target", "device", "semantics", "seed", "cases", "duration_s", "findings"):
        assert key in summary
    assert summary["cases"] == 10 and summary["findings"] == []


def test_finding_exits_1_and_its_replay_command_reproduces_it(tmp_path):
    out = harness("run", "--device", "cpu", "--mutant", "scheduler_no_wait", "--examples", "50",
                  "--report-dir", str(tmp_path))
    assert out.returncode == 1, out.stdout + out.stderr
    finding = json.loads((tmp_path / "summary.json").read_text())["findings"][0]
    assert {"oracle", "kind", "case", "replay"} <= set(finding)
    replay = subprocess.run(finding["replay"].replace("python", sys.executable, 1), shell=True, capture_output=True,
                            text=True, timeout=300)
    assert replay.returncode == 1 and "finding(s)" in replay.stdout


@pytest.mark.parametrize("args,needle", [
    (["run", "--device", "tpu"], "cpu, cuda, auto"),
    (["run", "--semantics", "0.6"], "pr, 0.5.23"),
    (["run", "--profile", "weekly"], "dev, ci, nightly"),
    (["run", "--target", "nonsense"], "reference, sglang, MODULE:FACTORY"),
    (["run", "--mutant", "nope"], "snapshot_skipped"),
    (["run", "--examples", "0"], "--examples"),
    (["replay", "--case", "{]"], "not valid JSON"),
    (["frobnicate"], "invalid choice"),
    (["run", "--examples", "10000000000000000000"], "argument --examples: 10000000000000000000 is out of range: "
                                                    "an integer from 1 to 1,000,000"),
    (["run", "--examples", "1e3"], "argument --examples: '1e3' is not an integer from 1 to 1,000,000"),
    (["run", "--progress-every", "nan"], "argument --progress-every: nan: a finite number of seconds >= 0"),
    (["run", "--oracles", ""], "--oracles='' names no oracle; give a comma-separated subset of: execution"),
    (["run", "--target", "no_such_module:factory"], "--target='no_such_module:factory': no module named "
                                                    "'no_such_module'; allowed: reference, sglang"),
    (["run", "--workers", str(cpu_cores() + 1)], f"--workers={cpu_cores() + 1}: more workers than the "
                                                 f"{cpu_cores()} core(s)"),
    (["nightly", "--device", "tpu"], "argument --device: 'tpu' is not one of: cuda, cpu"),
    (["mutants", "--semantics", "0.6"], "argument --semantics: '0.6' is not one of: pr, 0.5.23"),
    (["replay", "--case", "{}"], "case: the field batches is missing"),
    (["replay", "--case", '{"batches": [{}], "data_seed": 1180591620717411303424}'],
     "data_seed: 1,180,591,620,717,411,303,424 is over the limit of 4,294,967,295"),
    (["replay", "--case", '{"batches": [{"requests": [{"prefix_len": 0, "extend_len": 60000}]}]}'],
     "60,000 is over the limit of 32,768"),
])
def test_bad_usage_exits_2_with_the_allowed_values(args, needle, tmp_path):
    out = harness(*args, cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert needle in out.stderr
    assert "Traceback" not in out.stderr
    assert list(tmp_path.iterdir()) == [], "a refused command wrote something"


@pytest.mark.parametrize("report_dir, needle", [
    ("/proc/x/y", "no folder can be made in /proc"),
    ("/proc/x", "no folder can be made in /proc"),
    ("a-file/report", "a-file is a file, so no folder can be made under it"),
    ("", "an empty path"),
    (".", "needs a name of its own"),
    ("out/..", "needs a name of its own"),
    ("out/../..", "needs a name of its own"),
    ("../" + "{cwd}", "is the working folder or holds it"),
])
def test_a_report_dir_the_run_could_not_replace_exits_2_before_the_first_case(tmp_path, report_dir, needle):
    """Each of these once ran the whole campaign and lost its results to a traceback at the end
    (`out/..` copied the folder into itself until the name was too long)."""
    (tmp_path / "a-file").write_text("a file")
    (tmp_path / "out").mkdir()
    out = harness("run", "--device", "cpu", "--examples", "2", "--report-dir", report_dir.format(cwd=tmp_path.name),
                  cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "argument --report-dir: " in out.stderr and needle in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and "cases on cpu" not in out.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "out"] and not any((tmp_path / "out").iterdir())


def test_a_target_module_that_fails_to_import_its_own_dependency_exits_3(tmp_path):
    """A module that is there but cannot load (a missing package behind it) is the environment, not usage."""
    (tmp_path / "needs_a_package.py").write_text("import no_such_package_anywhere\n")
    out = harness("run", "--device", "cpu", "--target", "needs_a_package:factory", cwd=tmp_path)
    assert out.returncode == 3 and "cannot import 'needs_a_package'" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_a_semantics_the_target_does_not_implement_exits_2_before_the_first_case(tmp_path):
    """A target that implements `pr` only (as the installed sglang 0.5.19 to 0.5.22 do) with the default `--semantics
    0.5.23`: once every case was refused inside the campaign, a traceback and exit 5."""
    (tmp_path / "pr_only_target.py").write_text(
        "from harness.targets.reference import ReferenceTarget\n\n\n"
        "def factory():\n"
        "    target = ReferenceTarget(name='pr-only')\n"
        "    target.semantics_supported = ('pr',)\n"
        "    return target\n")
    out = harness("run", "--device", "cpu", "--examples", "2", "--target", "pr_only_target:factory",
                  "--report-dir", str(tmp_path / "r"), cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "--semantics='0.5.23': target pr-only implements pr only (give --semantics pr)" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "r").exists()
    ran = harness("run", "--device", "cpu", "--examples", "2", "--target", "pr_only_target:factory",
                  "--semantics", "pr", "--report-dir", str(tmp_path / "r"), cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible here: --device cuda is valid")
def test_cuda_without_a_gpu_exits_3_naming_the_device_before_any_work(tmp_path):
    out = harness("run", "--device", "cuda", "--examples", "2", "--report-dir", str(tmp_path / "r"))
    assert out.returncode == 3 and "--device cuda: no CUDA device is visible" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "r").exists()


def test_triage_reports_the_missing_attribute_with_its_line(tmp_path):
    clean = harness("triage", "--device", "cpu", "--examples", "5", "--report-dir", str(tmp_path / "clean"))
    assert clean.returncode == 0, clean.stdout + clean.stderr
    broken = harness("triage", "--device", "cpu", "--examples", "5", "--mutant", "missing_token_to_kv_pool",
                     "--report-dir", str(tmp_path / "broken"))
    assert broken.returncode == 1
    report = json.loads((tmp_path / "broken" / "triage.json").read_text())
    (first,) = report["contract_breaks"]
    assert first["attribute"] == "token_to_kv_pool" and first["file"].endswith("model/backend.py")


def test_the_harnesss_own_crash_exits_5_never_1(monkeypatch, capsys):
    """An exception the harness did not raise on purpose is its own bug: 1 would say "found"."""
    def broken(args):
        raise KeyError("no_such_field")

    monkeypatch.setattr(replay_command, "run", broken)
    assert cli.main(["replay", "--case", "{}"]) == ExitCode.INTERNAL == 5
    err = capsys.readouterr().err
    assert "internal error: the harness itself failed (not the system under test), exit 5: KeyError" in err
    assert "tests/test_cli.py" in err and "in broken" in err


def test_triage_of_a_target_without_an_attention_backend_names_what_is_missing(monkeypatch, capsys, tmp_path):
    """Once an AttributeError traceback; triage checks the session's `model_runner.attn_backend`."""
    bare = SimpleNamespace(name="bare", open=lambda case, device: SimpleNamespace(model_runner=SimpleNamespace()))
    monkeypatch.setattr(TargetSpec, "load", lambda spec: bare)
    assert cli.main(["triage", "--device", "cpu", "--report-dir", str(tmp_path)]) == 2
    assert "its session has no model_runner.attn_backend" in capsys.readouterr().err


def test_a_report_dir_that_is_a_file_exits_2_before_any_case(tmp_path):
    taken = tmp_path / "report"
    taken.write_text("not a folder")
    out = harness("run", "--device", "cpu", "--examples", "2", "--report-dir", str(taken))
    assert out.returncode == 2 and "exists and is not a directory" in out.stderr, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and "cases on cpu" not in out.stdout
    assert taken.read_text() == "not a folder"


def test_a_kill_table_with_a_survivor_exits_3_as_its_page_says_broken(tmp_path):
    """`cp_snapshot_global` needs a case with CP active (the unseeded kill table's 21st of 60): the one case of
    `--examples 1 --no-seeds`, hypothesis's simplest, has none, and it survives."""
    out = harness("mutants", "--only", "cp_snapshot_global", "--examples", "1", "--no-seeds",
                  "--report-dir", str(tmp_path))
    assert out.returncode == 3, out.stdout + out.stderr
    assert "ALIVE" in out.stdout and "0/1 mutants killed" in out.stdout
    assert "<title>BROKEN" in (tmp_path / "index.html").read_text()
