"""The report folder: JUnit XML, the verdict, corrupt-file errors, re-rendering, atomic writes."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.case import Batch, Case, Mutation, Request
from harness.cli import main
from harness.engine import run_case
from harness.errors import InvalidArgument, describe_internal_error
from harness.mutants.corpus import mutant_target
from harness.overlap import BatchOverlap, FastPathOverlap
from reports import junit
from reports.cli import render_folder
from reports.folder import ReportError, load_folder
from reports.html import first_difference, render_html
from reports.verdict import BROKEN, CLEAN, FOUND, INTERRUPTED, verdict_of
from reports.writers import replace_report, write_json_atomically, write_text_atomically

pytest_plugins = ["pytester"]  # the reporting plugin is checked in an inner pytest run

REPLAY = "python -m harness replay --target reference --mutant snapshot_skipped --device cpu --case '{}'"
DIFF_MESSAGE = ("host_kv: 216 element(s) differ from the barriered run; first at index [0, 1, 0]: "
                "overlapped 0, barriered 0.188595")
DIFF_DETAILS = {"tensor": "host_kv", "count": 216, "index": [0, 1, 0], "overlapped": "0", "barriered": "0.188595"}


def finding(oracle="differential", kind="output-differs", message=DIFF_MESSAGE, **extra) -> dict:
    return {"oracle": oracle, "kind": kind, "message": message, "batch": 0, "severity": "correctness",
            "details": DIFF_DETAILS, "case": {}, "case_summary": "sem=0.5.23 spec=NONE [EXTEND 9+6]",
            "replay": REPLAY, **extra}


def summary(findings=(), cases=4, telemetry=None) -> dict:
    log = [{"i": i, "t": 0.1 * i, "outcome": "found" if findings and i == cases else "clean", "tokens": 3 * i,
            "requests": 1 + i % 3, "graph": i % 2 == 0, "spec": "NONE"} for i in range(1, cases + 1)]
    data = {"target": "reference", "device": "cpu", "semantics": "0.5.23", "seed": None, "profile": "ci",
            "cases": cases, "duration_s": 0.1 * cases, "cases_per_second": 10.0,
            "first_detection": {"examples": cases, "seconds": 0.1 * cases} if findings else None,
            "findings": list(findings), "cases_log": log, "mutant": None}
    if telemetry is not None:
        data["telemetry"] = telemetry
    return data


def telemetry(suspect=False) -> dict:
    gpu = {"available": True, "after": {"index": 0, "name": "NVIDIA H200", "sm_clock_mhz": 1980,
                                        "clock_events": ["hw_thermal_slowdown"] if suspect else []}}
    return {"gpus": [gpu], "suspect": suspect, "reasons": ["clock event hw_thermal_slowdown active"] if suspect else []}


def mutant_row(name, killed=True, seconds=0.12, examples=3) -> dict:
    return {"name": name, "description": f"{name} put back", "source": "#35947", "expected_oracle": "differential",
            "killed": killed, "oracle": "differential" if killed else None, "oracles": ["differential"] if killed else [],
            "examples_to_detect": examples if killed else None, "seconds_to_detect": seconds if killed else None,
            "minimal_case": "sem=0.5.23 spec=NONE [EXTEND 2+3]" if killed else None,
            "replay": REPLAY if killed else None, "contract_failures": []}


def san_result(tool, case, status, expected="clean", kinds=()) -> dict:
    return {"tool": tool, "case": case, "status": status, "problem": "timed out after 300 s" if status == "failed" else None,
            "exit_code": 0 if status == "clean" else 1, "errors": len(kinds), "warnings": 0, "seconds": 4.0,
            "plain_seconds": 0.5, "slowdown": 8.0, "kernels_seen": ["_sparse_attention_kernel"],
            "findings": [{"kind": k, "kernel": "planted", "location": "planted.py:12", "thread": "(3,0,0)",
                          "block": "(0,0,0)", "address": "0x7f00", "access": "write", "severity": "error",
                          "message": f"{k} in planted"} for k in kinds],
            "expected": expected, "replay": f"python -m harness sanitize --tool {tool} {case}"}


def sanitizer(results) -> dict:
    return {"binary": {"path": "compute-sanitizer", "source": "PATH", "version": "2025.1"}, "results": results}


def kernel() -> dict:
    return {"device": "NVIDIA H200", "rows": [
        {"name": "sparse_attention", "tokens": t, "ms": 0.01 * t ** 0.8, "gbps": 900.0, "pct_roofline": 19.0,
         "roofline_gbps": 4800.0} for t in (64, 512, 4096)]}


def nightly(campaign="clean") -> dict:
    code = {"clean": 0, "found": 1, "broken": 3}[campaign]
    return {"exit_code": code, "steps": [
        {"name": "pytest", "command": ["python", "-m", "pytest"], "exit_code": None, "seconds": 0.0, "outcome": "skipped"},
        {"name": "campaign", "command": ["python", "-m", "harness", "run"], "exit_code": code, "seconds": 9.5,
         "outcome": campaign}]}


def write_folder(path: Path, **files) -> Path:
    """`files`: name (dots as underscores, e.g. summary_json) -> JSON data, or text for a raw file."""
    path.mkdir(parents=True, exist_ok=True)
    for key, data in files.items():
        name = key.replace("_json", ".json").replace("_xml", ".xml")
        (path / name).write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def full_folder(path: Path) -> Path:
    """Every part present, with a finding: what the browser test opens."""
    return write_folder(
        path, summary_json=summary([finding(), finding("happens-before", "unordered-access", "race on 'x'")],
                                   telemetry=telemetry()),
        mutants_json=[mutant_row("snapshot_skipped"), mutant_row("copy_keeps_cache", seconds=0.3, examples=7)],
        sanitizer_json=sanitizer([san_result("racecheck", "planted_race", "found", "race", ["race"]),
                                  san_result("racecheck", "attention_t5", "clean"),
                                  san_result("memcheck", "attention_t5", "clean")]),
        kernel_json=kernel(), nightly_json=nightly("found"),
        triage_json={"target": "reference", "device": "cpu", "semantics": "0.5.23",
                     "contract_breaks": [{"cls": "DeepseekV4AttnBackend", "attribute": "token_to_kv_pool",
                                          "call_path": ["init_forward_metadata", "_build"], "file": "backend.py",
                                          "line": 120}], "campaign": summary()})


# -- the campaign's per-case log ------------------------------------------------------------------

def test_campaign_summary_logs_every_counted_case(tmp_path):
    from harness.campaign import run_campaign
    from harness.targets import ReferenceTarget

    data = run_campaign(ReferenceTarget(), examples=2, seeds=False).summary()
    assert len(data["cases_log"]) == data["cases"] == 2
    assert [r["i"] for r in data["cases_log"]] == [1, 2]
    assert all(r["outcome"] == "clean" and r["tokens"] >= 0 and r["requests"] >= 0 for r in data["cases_log"])
    assert load_folder(write_folder(tmp_path, summary_json=data)).summary["cases_log"] == data["cases_log"]


# -- JUnit ----------------------------------------------------------------------------------------

def _parse(suite: ET.Element) -> ET.Element:
    return ET.fromstring(junit.to_bytes(suite)).find("testsuite")


def test_campaign_junit_fails_the_finding_case_with_replay_and_telemetry_properties(tmp_path):
    data = summary([finding()], telemetry=telemetry(suspect=True))
    suite = _parse(junit.campaign_suite(load_folder(write_folder(tmp_path, summary_json=data)).summary))
    assert suite.get("tests") == "4" and suite.get("failures") == "1" and suite.get("errors") == "0"
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert props["telemetry.suspect"] == "true" and "hw_thermal_slowdown" in props["telemetry.reasons"]
    assert props["telemetry.gpus.0.after.name"] == "NVIDIA H200"
    failing = [c for c in suite.findall("testcase") if c.find("failure") is not None]
    assert failing[0].get("name").startswith("case 4:")
    case_props = {p.get("name"): p.get("value") for p in failing[0].iter("property")}
    assert case_props["replay"] == REPLAY
    assert "differential/output-differs" in failing[0].find("failure").get("message")


def test_clean_campaign_junit_passes_and_an_empty_one_errors():
    assert _parse(junit.campaign_suite(summary())).get("failures") == "0"
    empty = _parse(junit.campaign_suite(summary(cases=0)))
    assert empty.get("errors") == "1" and "no cases" in empty.find("testcase/error").get("message")


def test_sanitizer_junit_without_a_binary_is_an_error():
    suite = _parse(junit.sanitizer_suite({"binary": None, "error": "compute-sanitizer was not found", "results": []}))
    assert suite.get("errors") == "1" and "not found" in suite.find("testcase/error").get("message")


def test_mutant_and_sanitizer_junit():
    mutants = _parse(junit.mutants_suite([mutant_row("a"), mutant_row("b", killed=False)]))
    assert mutants.get("tests") == "2" and mutants.get("failures") == "1"
    assert "survived" in mutants.find("testcase[@name='b']/failure").get("message")
    san = _parse(junit.sanitizer_suite(sanitizer([
        san_result("racecheck", "planted_race", "found", "race", ["race"]),  # as expected: passes
        san_result("memcheck", "attention", "found", "clean", ["out-of-bounds"]),  # a real finding
        san_result("initcheck", "planted_uninit", "clean", "uninitialized-read"),  # missed the planted bug
        san_result("synccheck", "attention", "failed")])))
    assert (san.get("tests"), san.get("failures"), san.get("errors")) == ("4", "2", "1")
    assert san.find("testcase[@name='planted_race']/failure") is None
    assert "not found" in san.find("testcase[@name='planted_uninit']/failure").get("message")
    assert {p.get("name") for p in san.find("properties")} == {"binary.path", "binary.source", "binary.version"}


def test_the_sanitizer_commands_own_json_loads_and_agrees_with_its_ok(tmp_path):
    """The contract with harness/sanitizer: its result objects as it writes them."""
    from harness.sanitizer.binary import SanitizerBinary
    from harness.sanitizer.cli import figures
    from harness.sanitizer.parse import Finding
    from harness.sanitizer.runner import ToolResult

    race = Finding("race", "planted_race", "planted.py:9", "(1,0,0)", "(0,0,0)", "0x10", "RAW shared 4", "error", "hazard")
    results = [ToolResult("racecheck", "planted_race", "found", None, 1, 1, 0, 3.0, [race], "race", "r1",
                          ["planted_race"], plain_seconds=0.5, raw={"xml": "racecheck-planted_race.xml"}),
               ToolResult("memcheck", "attention_t5", "clean", None, 0, 0, 0, 2.0, [], "clean", "r2", ["k"]),
               ToolResult("initcheck", "planted_uninit", "clean", None, 0, 0, 0, 2.0, [], "uninitialized-read", "r3")]
    doc = {"binary": SanitizerBinary("/usr/local/cuda/bin/compute-sanitizer", "CUDA_HOME", "2025.2").as_dict(),
           "tools": ["racecheck"], "cases": [], "jobs": 1, "ok": False, "figures": figures(results),
           "results": [r.as_dict() for r in results]}
    folder = load_folder(write_folder(tmp_path, sanitizer_json=doc))
    verdict = verdict_of(folder)
    missed = "sanitizer: initcheck on planted_uninit: the planted uninitialized-read was not found"
    assert verdict.status == BROKEN and verdict.broken == [missed]
    page = render_html(folder)
    assert 'href="sanitizer/racecheck-planted_race.xml"' in page and "errors in clean cases" in page
    suite = _parse(junit.sanitizer_suite(doc))
    assert [c.get("name") for c in suite.findall("testcase") if len(c.findall("failure"))] == ["planted_uninit"]


def test_the_page_says_where_the_campaign_s_time_went_and_a_bad_phase_is_refused(tmp_path):
    spent = {"world": 0.5, "oracles": 2.0, "race_delay": 1.5, "campaign": 1.0}
    page = render_html(load_folder(write_folder(tmp_path / "ok", summary_json={**summary(), "time": spent})))
    table = page[page.index("<table>", page.index('id="time"')):]
    assert table.index("oracles") < table.index("race delay") < table.index("campaign") < table.index("world")
    assert "<td>40%</td>" in table  # 2.0 of 5.0 s
    with pytest.raises(InvalidArgument, match="time.world"):
        load_folder(write_folder(tmp_path / "bad", summary_json={**summary(), "time": {"world": "slow"}}))


def test_the_page_counts_the_race_gates_and_a_count_that_is_not_a_number_is_refused(tmp_path):
    gates = {"awaited": 3, "deadline": 2, "leaked": 1}
    page = render_html(load_folder(write_folder(tmp_path / "ok", summary_json={**summary(), "race_gates": gates})))
    table = page[page.index("<table>", page.index('id="race-gates"')):]
    assert table.index("awaited") < table.index("deadline") < table.index("leaked") < table.index("</table>")
    assert '<tr class="bad"><td>leaked</td><td>1</td></tr>' in table
    assert 'id="race-gates"' not in render_html(load_folder(write_folder(tmp_path / "cpu", summary_json=summary())))
    with pytest.raises(InvalidArgument, match="race_gates.awaited"):
        load_folder(write_folder(tmp_path / "bad", summary_json={**summary(), "race_gates": {"awaited": "many"}}))


def test_the_page_shows_the_fast_path_overlap_as_a_line_a_table_and_a_figure_or_why_it_was_not_measured(tmp_path):
    tally = FastPathOverlap()
    tally.add([BatchOverlap(True, 0.61), BatchOverlap(True, 0.02), BatchOverlap(True, 0.45), BatchOverlap(False, -0.01)])
    measured = tally.to_dict(timed=True)
    page = render_html(load_folder(write_folder(tmp_path / "cuda", summary_json={**summary(),
                                                                                 "fast_path_overlap": measured})))
    section = page[page.index('id="fast-path-overlap"'):page.index("</figure>", page.index('id="fast-path-overlap"'))]
    assert ("the scheduler started 0.450 ms before the forward ended on a publishing batch (median; "
            "min 0.020, max 0.610 ms before the end), more than 0.05 ms before on 2 of 3 publishing batches") in section
    assert "<td>published read-done</td><td>3</td><td>3</td><td>2</td><td>0.02</td><td>0.45</td><td>0.61</td>" in section
    assert "<svg" in section and "The fast path in time" in section
    cpu = render_html(load_folder(write_folder(tmp_path / "cpu", summary_json={
        **summary(), "fast_path_overlap": FastPathOverlap().to_dict(timed=False)})))
    section = cpu[cpu.index('id="fast-path-overlap"'):cpu.index("</p>", cpu.index("not measured"))]
    assert "not measured: the device has no clock" in section and "<table>" not in section and "<svg" not in section
    assert 'id="fast-path-overlap"' not in render_html(load_folder(write_folder(tmp_path / "old", summary_json=summary())))
    with pytest.raises(InvalidArgument, match="fast_path_overlap.publishing.measured"):
        load_folder(write_folder(tmp_path / "bad", summary_json={
            **summary(), "fast_path_overlap": {**measured, "publishing": {**measured["publishing"], "measured": "3"}}}))


def test_the_page_says_how_many_cases_were_judged_at_once_and_refuses_a_count_that_is_not_one(tmp_path):
    page = render_html(load_folder(write_folder(tmp_path / "ok", summary_json={**summary(), "jobs": 8})))
    assert "<div><b>judged at once</b>8</div>" in page
    with pytest.raises(InvalidArgument, match="jobs"):
        load_folder(write_folder(tmp_path / "bad", summary_json={**summary(), "jobs": "eight"}))


def test_a_leaked_race_gate_is_warned_about_and_a_clean_count_is_not():
    from harness.commands.run import gate_counts, gate_warnings

    assert gate_counts({"landed": 2, "awaited": 5}) == "5 awaited, 2 landed"
    assert gate_warnings({"awaited": 5, "deadline": 4}) == []
    (warning,) = gate_warnings({"awaited": 5, "leaked": 1})
    assert "1 race gate(s) leaked" in warning


def test_telemetry_as_the_run_command_writes_it(tmp_path):
    """harness/telemetry.py's record: unavailable on a CPU machine, suspect on a throttled GPU."""
    from harness.telemetry import GpuSnapshot, TelemetryRecord

    cpu = TelemetryRecord(available=False, reason="NVML did not initialise (no NVIDIA driver?)").to_dict()
    folder = load_folder(write_folder(tmp_path / "cpu", summary_json=summary(telemetry=cpu)))
    assert verdict_of(folder).status == CLEAN and "NVML did not initialise" in render_html(folder)
    hot = GpuSnapshot(index=0, name="NVIDIA H200", clock_events=["hw_thermal_slowdown"], ecc={})
    gpu = TelemetryRecord(available=True, before=hot, after=hot, xids=[]).to_dict()
    folder = load_folder(write_folder(tmp_path / "gpu", summary_json=summary(telemetry=gpu)))
    verdict = verdict_of(folder)
    assert verdict.status == BROKEN and "hw_thermal_slowdown" in verdict.reason
    assert "GPU 0: NVIDIA H200" in render_html(folder)
    props = {p.get("name"): p.get("value") for p in _parse(junit.campaign_suite(folder.summary)).find("properties")}
    assert props["telemetry.suspect"] == "true" and props["telemetry.gpus.0.after.name"] == "NVIDIA H200"
    with pytest.raises(ReportError, match="field 'telemetry' has neither 'gpus'"):
        load_folder(write_folder(tmp_path / "bad", summary_json=summary(telemetry={"seconds": 1.0})))


def test_static_only_triage_and_versions_as_their_commands_write_them(tmp_path):
    from dataclasses import asdict

    from harness.contracts.source import StaticBreak
    from harness.triage.versions import VersionResult, VersionsOutcome

    broke = StaticBreak("DeepseekV4AttnBackend", "token_to_kv_pool", "init_forward_metadata", "backend.py", 88)
    triage = {"target": "sglang-0.5.23", "static_only": True, "static_missing_modules": [],
              "static_breaks": [asdict(broke)], "static_unknowable": [], "static_subclass_hooks": [], "static_classes": []}
    versions = VersionsOutcome([VersionResult("0.5.22", "pass", "0 breaks"), VersionResult("0.5.23", "fail", "1 break")],
                               first_failing="0.5.23", last_passing="0.5.22").to_json()
    folder = load_folder(write_folder(tmp_path, triage_json=triage, versions_json=versions))
    verdict = verdict_of(folder)
    assert verdict.status == FOUND and "1 static break(s); first DeepseekV4AttnBackend.token_to_kv_pool" in verdict.reason
    assert "the first failing version is 0.5.23 (last passing: 0.5.22)" in verdict.found[1]
    page = render_html(folder)
    assert "static check of the source only" in page and "init_forward_metadata" in page and "1 break" in page
    with pytest.raises(ReportError, match="triage.json: missing field 'campaign'"):
        load_folder(write_folder(tmp_path, triage_json={**triage, "static_only": False, "device": "cpu",
                                                        "semantics": "pr", "contract_breaks": []}))


# -- the verdict ----------------------------------------------------------------------------------

@pytest.mark.parametrize("files,status,needle", [
    ({"summary_json": summary()}, CLEAN, "nothing found in 4 campaign cases"),
    ({"summary_json": summary([finding()])}, FOUND, "1 finding(s)"),
    ({"summary_json": summary(cases=0)}, BROKEN, "ran no cases"),
    ({"summary_json": summary(telemetry=telemetry(suspect=True))}, BROKEN, "GPU was suspect"),
    ({"mutants_json": [mutant_row("a"), mutant_row("b", killed=False)]}, BROKEN, "1 of 2 mutants survived (b)"),
    ({"mutants_json": [mutant_row("a")]}, CLEAN, "1/1 mutants killed"),
    ({"sanitizer_json": sanitizer([san_result("racecheck", "k", "failed")])}, BROKEN, "timed out"),
    ({"sanitizer_json": sanitizer([san_result("racecheck", "k", "found", "clean", ["race"])])}, FOUND, "1 finding(s)"),
    ({"sanitizer_json": sanitizer([san_result("racecheck", "p", "found", "race", ["race"])])}, CLEAN, "1 sanitizer"),
    ({"sanitizer_json": sanitizer([san_result("racecheck", "p", "clean", "race")])}, BROKEN, "planted race was not found"),
    ({"triage_json": {"target": "t", "device": "cpu", "semantics": "pr", "contract_breaks": [],
                      "campaign": summary()}}, CLEAN, "triage"),
    ({"sanitizer_json": {"binary": None, "error": "compute-sanitizer was not found", "ok": False, "results": []}},
     BROKEN, "sanitizer: compute-sanitizer was not found"),
    ({}, BROKEN, "holds none of the report files"),
    ({"nightly_json": nightly(campaign="broken")}, BROKEN, "nightly step campaign exited 3: could not run"),
    ({"nightly_json": nightly(), "summary_json": summary()}, CLEAN, "2 nightly steps"),
    # one verdict for an interrupted run, as `run` exits (4), not BROKEN beside a green "clean"
    ({"summary_json": {**summary(), "interrupted": "SIGINT"}}, INTERRUPTED, "interrupted by SIGINT after 4 cases"),
    ({"summary_json": {**summary([finding()]), "interrupted": "SIGINT"}}, FOUND, "1 finding(s)"),
    ({"summary_json": {**summary(telemetry=telemetry(suspect=True)), "interrupted": "SIGINT"}}, BROKEN, "suspect"),
])
def test_verdict(tmp_path, files, status, needle):
    verdict = verdict_of(load_folder(write_folder(tmp_path, **files)))
    assert verdict.status == status and needle in verdict.reason, verdict


@pytest.mark.parametrize("findings, status", [(0, CLEAN), (1, FOUND)])
def test_the_kill_tables_clean_reference_is_judged_too(tmp_path, findings, status):
    folder = write_folder(tmp_path, mutants_json=[mutant_row("a")])
    clean = {"name": "(clean reference)", "cases": 200, "findings": findings,
             "finding": "race on x" if findings else None}
    write_json_atomically(folder / "mutants-clean.json", clean)
    loaded = load_folder(folder)
    verdict = verdict_of(loaded)
    assert verdict.status == status, verdict
    suite = junit.mutants_suite(loaded.mutants, loaded.clean_reference)
    assert suite.get("failures") == str(findings)
    if findings:
        assert "the clean reference had 1 finding(s) in 200 cases: race on x" in verdict.reason
        assert "<code>race on x</code>" in render_html(loaded)


def test_a_partial_clean_reference_file_is_named(tmp_path):
    folder = write_folder(tmp_path, mutants_json=[mutant_row("a")])
    (folder / "mutants-clean.json").write_text(json.dumps({"cases": 3}))
    with pytest.raises(ReportError, match="mutants-clean.json: missing field 'findings'"):
        load_folder(folder)


def test_found_wins_over_broken_and_both_are_listed(tmp_path):
    folder = write_folder(tmp_path, summary_json=summary([finding()]), mutants_json=[mutant_row("b", killed=False)])
    verdict = verdict_of(load_folder(folder))
    assert verdict.status == FOUND and len(verdict.found) == 1 and "survived" in verdict.broken[0]
    assert "survived" not in verdict.reason


def test_first_differing_values_come_from_the_details():
    rows = dict(first_difference(finding()))
    assert rows == {"output": "host_kv", "index": "[0, 1, 0]", "overlapped run": "0", "barriered run": "0.188595"}
    f64 = finding("float64", "attention-mismatch", "batch 0 layer 1 (ratio 4): max error 0.5 > 1e-05 at token row 2 "
                  "(request 0, position 7)", details={"layer": 1, "ratio": 4, "token_row": 2, "request": 0,
                                                      "position": 7, "max_error": "0.5", "tolerance": 1e-05})
    assert dict(first_difference(f64)) == {"layer": "1 (ratio 4)", "request": "0", "token row": "2 at position 7",
                                           "max error": "0.5", "tolerance": "1e-05"}
    assert first_difference(finding("happens-before", "unordered-access", "race on 'x'", details={"buffer": "x"})) == []


def test_rewording_a_message_does_not_empty_the_report(tmp_path):
    """The page reads the finding's details, never its wording: a message said another way (or in another
    language) shows the same first differing values."""
    reworded = finding(message="host_kv changed under overlap (see the details)")
    assert first_difference(reworded) == first_difference(finding())
    page = render_html(load_folder(write_folder(tmp_path, summary_json=summary([reworded]))))
    assert "first differing values" in page and "0.188595" in page


def test_a_real_differing_output_carries_its_first_difference_in_details():
    """From the engine through the page: the seeded bug's differing output names its tensor, row and values."""
    case = Case(batches=(Batch(requests=(Request(5, 3),), mutations=(Mutation("req_to_token_rewrite"),)),))
    findings = [f for f in run_case(mutant_target("scheduler_no_wait"), case).findings if f.kind == "output-differs"]
    assert findings, "the seeded bug was not found"
    rows = dict(first_difference(dataclasses.asdict(findings[0])))
    assert rows["output"] == findings[0].details["tensor"]
    assert {"request", "token row", "index", "overlapped run", "barriered run"} <= set(rows)
    assert rows["overlapped run"] in findings[0].message and rows["barriered run"] in findings[0].message


# -- corrupt or partial files ---------------------------------------------------------------------

@pytest.mark.parametrize("name,text,needle", [
    ("summary.json", '{"target": "reference",\n  "cases": 3,\n  "dev', "summary.json: not valid JSON (Unterminated string"),
    ("summary.json", json.dumps({k: v for k, v in summary().items() if k != "cases"}), "summary.json: missing field 'cases'"),
    ("summary.json", json.dumps({**summary(), "cases": "7"}), "summary.json: field 'cases' must be int, got \"7\""),
    ("summary.json", json.dumps({**summary(), "findings": [{"oracle": "x"}]}), "missing field 'findings[0].kind'"),
    ("summary.json", json.dumps({**summary(), "cases_log": [{"i": 1}]}), "missing field 'cases_log[0].t'"),
    ("summary.json", "[1, 2]", "summary.json: the top level must be an object"),
    ("mutants.json", json.dumps([{"name": "a"}]), "mutants.json: missing field '[0].killed'"),
    ("sanitizer.json", json.dumps(sanitizer([{**san_result("racecheck", "k", "clean"), "status": "ok"}])),
     "sanitizer.json: field 'results[0].status' is 'ok'; allowed: 'clean', 'found' or 'failed'"),
    ("triage.json", json.dumps({"target": "t", "device": "cpu", "semantics": "pr", "contract_breaks": []}),
     "triage.json: missing field 'campaign'"),
    ("kernel.json", json.dumps({"rows": [{"tokens": 4}]}), "kernel.json: missing field 'rows[0].name'"),
    ("junit-pytest.xml", "<testsuites><testsuite tests='3'>", "junit-pytest.xml: not well-formed XML (line 1"),
])
def test_corrupt_or_partial_file_is_a_clear_error(tmp_path, name, text, needle):
    (tmp_path / name).write_text(text)
    with pytest.raises(ReportError) as raised:
        load_folder(tmp_path)
    assert needle in str(raised.value)


def test_report_command_names_the_corrupt_file_and_exits_2(tmp_path, capsys):
    (tmp_path / "summary.json").write_text('{"target": "reference", "cases": ')
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: summary.json: not valid JSON (") and "line 1 column" in err
    assert not (tmp_path / "index.html").exists()
    assert main(["report", str(tmp_path / "absent")]) == 2


def test_kernel_benchmark_rows_per_implementation_become_flat_rows(tmp_path):
    """The shape benchmarks/sparse_kernel.py writes: one object per implementation in each row."""
    rate = {"ms": 1.5, "GBps": 2100.0, "TFLOPs": 300.0, "flop_per_byte": 140.0, "roofline_TFLOPs": 990.0,
            "pct_roofline": 30.0}
    doc = {"device": "NVIDIA H200", "shape": {"heads": 64, "dim": 512}, "sweep": [{"config": {}}] * 3,
           "rows": [{"tokens": t, "triton": rate, "torch": {**rate, "ms": 40.0}} for t in (8192, 16384)]}
    folder = load_folder(write_folder(tmp_path, kernel_json=doc))
    assert [(r["name"], r["tokens"], r["ms"]) for r in folder.kernel["rows"]][:2] == [("triton", 8192, 1.5),
                                                                                       ("torch", 8192, 40.0)]
    assert folder.kernel["meta"] == {"device": "NVIDIA H200", "shape.heads": 64, "shape.dim": 512, "sweep": "3 entries"}
    assert "<svg" in render_html(folder)
    doc["rows"][1]["torch"]["ms"] = "slow"
    with pytest.raises(ReportError, match=r"field 'rows\[1\].torch.ms' must be number"):
        load_folder(write_folder(tmp_path, kernel_json=doc))


def test_good_files_load_without_error(tmp_path):
    folder = load_folder(full_folder(tmp_path))
    assert folder.summary and folder.mutants and folder.sanitizer and folder.kernel and folder.triage


# -- rendering ------------------------------------------------------------------------------------

def _without_log(data: dict) -> dict:
    """Fewer plots to draw: this test is about files and re-rendering, not plots."""
    return {k: v for k, v in data.items() if k != "cases_log"}


def test_report_command_renders_page_and_junit_and_re_renders(tmp_path, capsys):
    write_folder(tmp_path, summary_json=_without_log(summary()), mutants_json=[mutant_row("a")])
    assert main(["report", str(tmp_path)]) == 0
    assert "CLEAN: nothing found" in capsys.readouterr().out
    page = (tmp_path / "index.html").read_text()
    assert 'id="verdict">CLEAN<' in page and page.count("<svg") == 1  # the mutants' plot
    for name in (junit.CAMPAIGN, junit.MUTANTS):
        ET.parse(tmp_path / name)
    write_folder(tmp_path, summary_json=_without_log(summary([finding()])))
    assert main(["report", str(tmp_path)]) == 1
    page = (tmp_path / "index.html").read_text()
    assert 'id="verdict">FOUND<' in page and REPLAY.replace("'", "&#39;") in page and "0.188595" in page
    assert render_folder(tmp_path)[0] and (tmp_path / "index.html").read_text() == page  # deterministic


def test_missing_renderer_is_a_broken_environment(tmp_path, monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "reports.html", None)  # its import raises ImportError, as without matplotlib
    assert main(["report", str(write_folder(tmp_path, mutants_json=[mutant_row("a")]))]) == 3
    assert "needs jinja2 and matplotlib" in capsys.readouterr().err


def test_page_is_self_contained_and_holds_every_section(tmp_path):
    page = render_html(load_folder(full_folder(tmp_path)))
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page)
    assert "<script src" not in page and "@import" not in page and "url(http" not in page
    for anchor in ("campaign", "triage", "mutants", "sanitizer", "kernel", "telemetry", "nightly", "files"):
        assert f'id="{anchor}"' in page
    assert page.count("<svg") == 5  # cases, geometry, detection times, sanitizer slowdown, kernel roofline
    assert "token_to_kv_pool" in page and "NVIDIA H200" in page


def test_the_page_gives_the_command_that_replays_the_example_database(tmp_path):
    folder = write_folder(tmp_path / "night ly", summary_json={**_without_log(summary()), "profile": "nightly"})
    (folder / "examples" / "abc").mkdir(parents=True)
    (folder / "examples" / "abc" / "0f").write_bytes(b"x")
    page = render_html(load_folder(folder))
    assert ("python -m harness run --target reference --device cpu --semantics 0.5.23 --profile nightly "
            f"--report-dir &#39;{folder}&#39; --from-db") in page and "1 saved example(s)" in page
    assert "--from-db" not in render_html(load_folder(write_folder(tmp_path / "plain", summary_json=summary())))


def test_missing_parts_are_absent_sections(tmp_path):
    page = render_html(load_folder(write_folder(tmp_path, mutants_json=[mutant_row("a")])))
    assert 'id="mutants"' in page and 'id="campaign"' not in page and 'id="sanitizer"' not in page


# -- atomic writes --------------------------------------------------------------------------------

def test_a_killed_writer_leaves_the_old_file_and_no_partial_one(tmp_path, monkeypatch):
    target = tmp_path / "summary.json"
    write_json_atomically(target, {"cases": 1})

    def killed(src, dst):
        raise KeyboardInterrupt  # the process dies between writing the temporary file and the rename

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        write_json_atomically(target, {"cases": 2, "findings": ["x" * 100_000]})
    with pytest.raises(KeyboardInterrupt):
        write_text_atomically(tmp_path / "index.html", "<html>")
    assert json.loads(target.read_text()) == {"cases": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_atomic_write_replaces_whole_file(tmp_path):
    target = tmp_path / "deep" / "index.html"
    write_text_atomically(target, "old")
    write_text_atomically(target, "new")
    assert target.read_text() == "new" and [p.name for p in target.parent.iterdir()] == ["index.html"]


def test_a_page_that_fails_to_render_keeps_the_runs_files_in_the_folder(tmp_path):
    """A run's summary is written, then its page raises (a template fault): the summary goes into the folder
    without the page, the error says so, and `report` can render it later; the old page is not left beside it.
    A build that wrote none of the run's files leaves the old folder whole."""
    folder = tmp_path / "report"
    write_json_atomically(folder / "summary.json", {"cases": 1})
    write_text_atomically(folder / "index.html", "old page")
    write_text_atomically(folder / "kept.txt", "not replaced")

    def summary_then_fault(staging: Path) -> None:
        write_json_atomically(staging / "summary.json", {"cases": 2})
        raise RuntimeError("the template failed")

    with pytest.raises(RuntimeError) as info:
        replace_report(folder, ("summary.json", "index.html"), summary_then_fault)
    assert json.loads((folder / "summary.json").read_text()) == {"cases": 2}
    assert not (folder / "index.html").exists() and (folder / "kept.txt").read_text() == "not replaced"
    assert "python -m harness report" in describe_internal_error(info.value)
    assert [p.name for p in tmp_path.iterdir()] == ["report"]  # no staging folder left

    def fault_first(staging: Path) -> None:
        raise RuntimeError("nothing written")

    with pytest.raises(RuntimeError):
        replace_report(folder, ("summary.json", "index.html"), fault_first)
    assert json.loads((folder / "summary.json").read_text()) == {"cases": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["report"]


# -- the pytest plugin ----------------------------------------------------------------------------

def _inner_pytest(pytester, request, report: Path):
    pytester.makepyfile(test_sample="""
        def test_ok():
            pass

        def test_race(harness_replay):
            harness_replay("python -m harness replay --case '{}'")
            assert False, "attention differs from the barriered run"
    """)
    args = ["--harness-report", str(report), "-p", "no:xdist", "-p", "no:cacheprovider"]
    if not request.config.pluginmanager.has_plugin("dsv4_reporting"):  # a checkout without `pip install -e .`
        args += ["-p", "fixtures.reporting"]
    return pytester.runpytest(*args)


def test_pytest_plugin_writes_junit_with_the_replay_and_renders_the_page(pytester, request, tmp_path):
    result = _inner_pytest(pytester, request, tmp_path)
    result.assert_outcomes(passed=1, failed=1)
    suite = ET.parse(tmp_path / "junit-pytest.xml").getroot().find("testsuite")
    race = suite.find("testcase[@name='test_race']")
    assert race.find("failure") is not None
    assert {p.get("name"): p.get("value") for p in race.iter("property")} == {
        "replay": "python -m harness replay --case '{}'"}
    page = (tmp_path / "index.html").read_text()
    assert 'id="verdict">FOUND<' in page and "1 of 2 test(s) failed" in page
    assert "python -m harness replay --case &#39;{}&#39;" in page


def test_pytest_plugin_fails_the_session_on_a_corrupt_report_file(pytester, request, tmp_path):
    (tmp_path / "mutants.json").write_text("[{")
    result = _inner_pytest(pytester, request, tmp_path)
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR
    result.stdout.fnmatch_lines(["*harness report: error: mutants.json: not valid JSON*"])
    assert not (tmp_path / "index.html").exists()
