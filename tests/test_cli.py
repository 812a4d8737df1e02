"""The main job's contract: options, exit codes, summary.json."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from harness import cli
from harness.commands import replay as replay_command
from harness.commands import triage as triage_command
from harness.errors import ExitCode


def harness(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600)


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
])
def test_bad_usage_exits_2_with_the_allowed_values(args, needle):
    out = harness(*args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert needle in out.stderr
    assert "Traceback" not in out.stderr


def test_missing_module_target_exits_3():
    out = harness("run", "--device", "cpu", "--target", "no_such_module:factory")
    assert out.returncode == 3 and "cannot import" in out.stderr


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
    monkeypatch.setattr(triage_command, "load_target", lambda spec, mutant=None: bare)
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
    """`cp_snapshot_global` needs more than two unseeded cases (44 in the kill table): it survives here."""
    out = harness("mutants", "--only", "cp_snapshot_global", "--examples", "2", "--no-seeds",
                  "--report-dir", str(tmp_path))
    assert out.returncode == 3, out.stdout + out.stderr
    assert "ALIVE" in out.stdout and "0/1 mutants killed" in out.stdout
    assert "<title>BROKEN" in (tmp_path / "index.html").read_text()
