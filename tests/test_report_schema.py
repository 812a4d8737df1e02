"""The report files' one schema (reports/schema.py): every file as its command writes it is what its schema
declares, a file with a wrong field is refused naming the file and the field (exit 2), and a writer cannot
write a file the reader would refuse (the harness's own fault, exit 5, and the old report kept)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_reports import kernel

from harness.campaign import CampaignResult
from harness.cli import main
from harness.csan import Opinions, summarise
from harness.errors import EnvironmentBroken
from harness.sanitizer import cli as sanitizer_cli
from harness.sanitizer.binary import SanitizerBinary
from harness.sanitizer.parse import Finding
from harness.sanitizer.runner import ToolResult
from harness.triage.versions import VersionResult, VersionsOutcome
from reports.schema import (CSAN, KERNEL, REPLAY_SUMMARY, SANITIZER, SCHEMAS, VERSIONS, UnwritableReport,
                            check_written, read_report)
from reports.writers import write_report

NOT_WRITTEN_HERE = {KERNEL: "written by benchmarks/sparse_kernel.py on a GPU, outside the harness",
                    REPLAY_SUMMARY: "run --from-db's summary.json, through the same writer and schema"}


def _no_sanitizer():
    raise EnvironmentBroken("compute-sanitizer was not found (PATH, CUDA_HOME, pip)")


def _written_by_writers(folder: Path) -> None:
    """The files whose commands need a GPU or PyPI, from the objects those commands write them from."""
    results = [ToolResult("racecheck", "planted_race", "found", None, 1, 1, 0, 3.0,
                          [Finding("race", "k", "k.py:9", "(1,0,0)", "(0,0,0)", "0x10", "RAW", "error", "hazard")],
                          "race", "r1", ["k"], plain_seconds=0.5, raw={"xml": "racecheck-planted_race.xml"})]
    write_report(folder / SANITIZER, {
        "binary": SanitizerBinary("compute-sanitizer", "PATH", "2025.2").as_dict(), "target": "reference",
        "tools": ["racecheck"], "cases": ["planted_race"], "jobs": 1, "ok": True,
        "figures": sanitizer_cli.figures(results), "results": [r.as_dict() for r in results]})
    opinions = Opinions("sem=0.5.23 [EXTEND 2+3]", "python -m harness replay", ["graph 'g'"], [], [], 1, True)
    write_report(folder / CSAN, {**summarise([opinions]), "target": "reference", "mutant": None, "semantics": "0.5.23"})
    triage = json.loads((folder / "triage" / "triage.json").read_text())
    write_report(folder / VERSIONS, VersionsOutcome(
        [VersionResult("0.5.22", "pass", "0 breaks", triage), VersionResult("0.5.23", "fail", "1 break", triage)],
        first_failing="0.5.23", last_passing="0.5.22").to_json())


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    """Every report file, each written by its own command on the CPU (or, where that needs a GPU or PyPI,
    by the writer those commands use)."""
    root = tmp_path_factory.mktemp("reports")
    commands = [(["run", "--device", "cpu", "--examples", "4", "--report-dir", str(root / "run"), "-q"], 0),
                (["mutants", "--device", "cpu", "--examples", "2", "--only", "snapshot_skipped",
                  "--report-dir", str(root / "mutants")], 0),
                (["triage", "--device", "cpu", "--examples", "2", "--report-dir", str(root / "triage")], 0),
                (["triage", "--static-only", "--report-dir", str(root / "static")], 0),
                (["nightly", "--device", "cpu", "--skip", "pytest,campaign,mutants,sanitize",
                  "--report-dir", str(root / "nightly")], 0),
                (["sanitize", "--report-dir", str(root / "sanitize")], 3)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sanitizer_cli, "find_sanitizer", _no_sanitizer)  # the same file on a machine with the tool
        for argv, code in commands:
            assert main(argv) == code, argv
    _written_by_writers(root)
    return root


def test_every_report_file_a_command_writes_is_what_its_schema_declares(written, tmp_path):
    files = sorted(written.rglob("*.json"))
    for path in files:
        check_written(path.name, path.read_text())  # no field wrong, none undeclared
        assert read_report(path) == json.loads(path.read_text())
    assert {p.name for p in files} == set(SCHEMAS) - set(NOT_WRITTEN_HERE)
    assert read_report(_write(tmp_path, KERNEL, kernel()))  # the benchmark's shape, read


def _write(folder: Path, name: str, data) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(data))
    return folder / name


# one wrong field of each file its command wrote, and what the error names
WRONG = [
    ("run", "summary.json", lambda d: d["findings"].append({"oracle": "x"}), "missing field 'findings[0].kind'"),
    ("run", "summary.json", lambda d: d["coverage"].update(combinations_reached="12"),
     "field 'coverage.combinations_reached' must be int, got \"12\""),
    ("run", "summary.json", lambda d: d["cases_log"][1].update(outcome="maybe"),
     "field 'cases_log[1].outcome' is 'maybe'; allowed: 'clean' or 'found'"),
    ("run", "summary.json", lambda d: d.update(telemetry={"seconds": 1.0}),
     "field 'telemetry' has neither 'gpus' (records per GPU) nor 'available' (one NVML record)"),
    ("mutants", "mutants.json", lambda d: d[0].update(killed="yes"), "field '[0].killed' must be bool, got \"yes\""),
    ("mutants", "mutants-clean.json", lambda d: d.pop("findings"), "missing field 'findings'"),
    ("triage", "triage.json", lambda d: d["contract_breaks"].append({"cls": "B", "attribute": "a", "call_path": "f",
                                                                      "file": "b.py", "line": 3}),
     "field 'contract_breaks[0].call_path' must be a list, got \"f\""),
    ("triage", "triage.json", lambda d: d["campaign"].pop("duration_s"), "missing field 'campaign.duration_s'"),
    ("static", "triage.json", lambda d: d.update(static_breaks=[{"cls": "B"}]), "missing field 'static_breaks[0].attribute'"),
    ("nightly", "nightly.json", lambda d: d["steps"][0].update(outcome="fine"),
     "field 'steps[0].outcome' is 'fine'; allowed: 'clean', 'found', 'broken', 'skipped' or 'interrupted'"),
    ("sanitize", "sanitizer.json", lambda d: d.update(results={}), "field 'results' must be a list, got {}"),
    (".", "versions.json", lambda d: d["versions"][0].pop("status"), "missing field 'versions[0].status'"),
]


@pytest.mark.parametrize("source, name, spoil, needle", WRONG, ids=[f"{w[1]}:{w[3][:40]}" for w in WRONG])
def test_a_file_with_a_wrong_field_is_refused_naming_the_file_and_the_field(written, tmp_path, capsys, source, name,
                                                                            spoil, needle):
    data = json.loads((written / source / name).read_text())
    spoil(data)
    folder = _write(tmp_path / "folder", name, data).parent
    assert main(["report", str(folder)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {name}: {needle}")
    assert not (folder / "index.html").exists()
    assert main(["merge", str(folder), str(written / "run"), "--into", str(tmp_path / "merged")]) == 2
    assert f"error: {folder}: {name}: {needle}" in capsys.readouterr().err
    assert not (tmp_path / "merged").exists()


def test_a_writer_cannot_write_a_field_its_schema_refuses_or_does_not_declare(written, tmp_path):
    summary = json.loads((written / "run" / "summary.json").read_text())
    with pytest.raises(UnwritableReport, match=r"^summary.json: field 'verdict' is not declared in its schema"):
        write_report(tmp_path / "summary.json", {**summary, "verdict": "CLEAN"})
    with pytest.raises(UnwritableReport, match=r"^mutants-clean.json: field 'cases' must be int, got 2.5"):
        write_report(tmp_path / "mutants-clean.json", {"cases": 2.5, "findings": 0, "finding": None})
    assert not list(tmp_path.iterdir())


def test_a_campaign_whose_summary_its_schema_refuses_is_the_harness_s_fault_and_keeps_the_old_report(
        tmp_path, monkeypatch, capsys):
    report = tmp_path / "report"
    assert main(["run", "--device", "cpu", "--examples", "1", "--no-seeds", "--report-dir", str(report), "-q"]) == 0
    before = {p.name: p.read_bytes() for p in report.iterdir() if p.is_file()}
    summary = CampaignResult.summary
    monkeypatch.setattr(CampaignResult, "summary", lambda self: {**summary(self), "cases": str(self.cases)})
    assert main(["run", "--device", "cpu", "--examples", "1", "--no-seeds", "--report-dir", str(report), "--overwrite",
                 "-q"]) == 5
    assert "UnwritableReport: summary.json: field 'cases' must be int, got \"1\"" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in report.iterdir() if p.is_file()} == before
