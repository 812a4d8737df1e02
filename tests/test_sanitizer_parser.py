"""The compute-sanitizer wrapper on the CPU: the parser and the verdicts against outputs recorded on
an H200 (compute-sanitizer 2025.3.1, tests/data/sanitizer/), hand-broken copies of them, and the
whole `sanitize` command driven through a fake sanitizer binary that replays a recording."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from harness.cli import main
from harness.errors import EnvironmentBroken, InvalidArgument
from harness.sanitizer import binary as binary_mod
from harness.sanitizer import runner
from harness.sanitizer.cases import CASES, cases_of
from harness.sanitizer.cli import select
from harness.sanitizer.command import ERROR_EXITCODE, build_command
from harness.sanitizer.parse import OutputError, parse_summary, parse_xml
from harness.sanitizer.runner import PlainRun, RunOutputs, classify_run, run_sanitized
from harness.sanitizer.sglang_cases import PLANTED_EDITS, SGLANG_KERNELS
from reports import writers  # noqa: F401  imported before a test empties sys.path

DATA = Path(__file__).parent / "data" / "sanitizer"
RUNS = json.loads((DATA / "runs.json").read_text())


def recorded(name: str, **changes) -> RunOutputs:
    """One recorded run: exit code, XML, log and sentinel as the GPU machine left them."""
    sentinel = DATA / f"{name}.sentinel.json"
    out = RunOutputs(RUNS[name]["exit_code"], RUNS[name]["seconds"], xml=(DATA / f"{name}.xml").read_text(),
                     log=(DATA / f"{name}.log").read_text(),
                     sentinel=json.loads(sentinel.read_text()) if sentinel.is_file() else None)
    return replace(out, **changes)


def verdict(tool: str, case: str, out: RunOutputs):
    return classify_run(tool, CASES[case], out, timeout=60)


# -- real findings, recorded ----------------------------------------------------------------------

@pytest.mark.parametrize("tool, case, kind, errors, line", [
    ("racecheck", "planted-race", "race", 1024, 5),
    ("memcheck", "planted-oob", "out-of-bounds", 8, 17),
    ("initcheck", "planted-uninit", "uninitialized-read", 256, 23),
    ("synccheck", "planted-barrier", "barrier", 16, 33),
])
def test_each_planted_bug_is_found_by_its_tool_with_kernel_location_and_threads(tool, case, kind, errors, line):
    result = verdict(tool, case, recorded(f"{tool}-{case}"))
    assert (result.status, result.problem, result.ok) == ("found", None, True)
    assert result.errors == errors and result.exit_code == ERROR_EXITCODE
    first = next(f for f in result.findings if f.kind == kind)
    assert first.kernel == case.replace("-", "_") and first.location.endswith(f".cu:{line}")
    assert first.thread and first.block == "(0,0,0)" and first.severity == "error"
    assert case.replace("-", "_") in result.kernels_seen
    assert result.replay == f"python -m harness sanitize --tool {tool} {case}"


def test_racecheck_hazards_carry_both_accesses_and_the_shared_address():
    result = verdict("racecheck", "planted-race", recorded("racecheck-planted-race"))
    hazard = result.findings[0]
    assert hazard.access.startswith("RAW: Write at ") and " -> Read at " in hazard.access
    assert hazard.address.startswith("__shared__ 0x") and "Write (" in hazard.thread and "Read (" in hazard.thread
    assert len(result.findings) == 100 and result.truncated  # the XML holds --print-limit records of 1024


def test_memcheck_out_of_bounds_record_and_the_api_errors_it_caused():
    result = verdict("memcheck", "planted-oob", recorded("memcheck-planted-oob"))
    oob = result.findings[0]
    assert (oob.kind, oob.thread, oob.access) == ("out-of-bounds", "(255,0,0)", "write __global__ 4 bytes")
    assert oob.address.startswith("0x")
    assert {f.kind for f in result.findings[1:]} == {"api-error"}


def test_racecheck_analysis_report_folds_hazards_into_one_race():
    findings = parse_xml((DATA / "racecheck-analysis-planted-race.xml").read_text())
    assert len(findings) == 1 and findings[0].kind == "race" and "(1024 hazards)" in findings[0].message
    assert findings[0].access.startswith("Write at ") and findings[0].kernel == "planted_race"


@pytest.mark.parametrize("tool, case", [("racecheck", "planted-clean"), ("synccheck", "planted-clean"),
                                        ("memcheck", "planted-clean"), ("initcheck", "planted-clean"),
                                        ("racecheck", "metadata-eager-2req"), ("initcheck", "metadata-graph-3req")])
def test_clean_runs_are_clean_and_prove_their_kernels_ran(tool, case):
    result = verdict(tool, case, recorded(f"{tool}-{case}"))
    assert (result.status, result.problem, result.errors, result.findings) == ("clean", None, 0, [])
    assert result.ok and result.kernels_seen


def test_a_clean_case_with_errors_is_a_finding_not_a_pass():
    """Recorded: memcheck of a graph case with PyTorch's caching allocator off; capture then calls cudaMalloc."""
    result = verdict("memcheck", "metadata-graph-2req", recorded("memcheck-nocache-metadata-graph-2req"))
    assert result.status == "found" and not result.ok and result.errors == 8
    assert {f.kind for f in result.findings} == {"api-error"} and "cudaMalloc" in result.findings[0].message


def test_a_planted_bug_the_tool_does_not_report_is_a_failure():
    out = recorded("racecheck-planted-clean", sentinel={"kernels": ["planted_race"], "synchronized": True})
    result = verdict("racecheck", "planted-race", out)
    assert result.status == "failed" and result.problem.code == "planted-not-found" and not result.ok


# -- broken outputs: each a failure with its own problem -------------------------------------------

def test_truncated_xml_is_malformed():
    xml = (DATA / "racecheck-planted-race.xml").read_text()
    result = verdict("racecheck", "planted-race", recorded("racecheck-planted-race", xml=xml[:len(xml) // 2]))
    assert result.status == "failed" and result.problem.code == "malformed-xml" and "does not parse" in str(result.problem)


@pytest.mark.parametrize("xml", ["", "<?xml version='1.0'?><html/>"])
def test_empty_or_foreign_xml_is_malformed(xml):
    with pytest.raises(OutputError) as err:
        parse_xml(xml)
    assert err.value.code == "malformed-xml"


def test_missing_xml_file():
    result = verdict("memcheck", "planted-clean", recorded("memcheck-planted-clean", xml=None))
    assert result.problem.code == "no-xml" and result.status == "failed"


def test_missing_summary_line():
    log = (DATA / "memcheck-planted-clean.log").read_text().replace("ERROR SUMMARY: 0 errors", "")
    result = verdict("memcheck", "planted-clean", recorded("memcheck-planted-clean", log=log))
    assert result.problem.code == "no-summary" and result.status == "failed"


def test_xml_and_summary_disagreeing():
    log = (DATA / "memcheck-planted-oob.log").read_text().replace("ERROR SUMMARY: 8 errors", "ERROR SUMMARY: 3 errors")
    result = verdict("memcheck", "planted-oob", recorded("memcheck-planted-oob", log=log))
    assert result.problem.code == "summary-mismatch"


def test_nonzero_exit_without_errors():
    result = verdict("memcheck", "planted-clean", recorded("memcheck-planted-clean", exit_code=1))
    assert result.problem.code == "exit-without-errors" and result.status == "failed"


def test_errors_without_the_error_exitcode():
    result = verdict("memcheck", "planted-oob", recorded("memcheck-planted-oob", exit_code=0))
    assert result.problem.code == "exit-mismatch"


def test_recorded_case_that_failed_before_launching_never_ran():
    """Recorded: the Triton kernel failed to compile, so the program exited 1 and the tool saw no kernel."""
    result = verdict("memcheck", "attention-eager-t5", recorded("memcheck-attention-eager-t5"))
    assert result.problem.code == "never-ran" and "CompilationError" in result.problem.message


def test_no_sentinel_means_the_kernels_never_ran():
    result = verdict("racecheck", "planted-clean", recorded("racecheck-planted-clean", sentinel=None))
    assert result.problem.code == "never-ran" and "no sentinel" in result.problem.message


def test_a_launch_that_never_completed_and_no_finding_names_it():
    out = recorded("racecheck-planted-clean", sentinel={"kernels": ["planted_race"], "synchronized": False,
                                                         "error": "CUDARuntimeError: launch failure"})
    result = verdict("racecheck", "planted-clean", out)
    assert result.problem.code == "never-ran" and "planted_race" in result.problem.message


def test_a_kernel_the_filter_does_not_match_was_never_checked():
    out = recorded("racecheck-planted-clean", sentinel={"kernels": ["other_kernel"], "synchronized": True})
    result = verdict("racecheck", "planted-clean", out)
    assert result.problem.code == "kernel-filtered-out" and "regex=planted_" in result.problem.message


def test_timeout():
    result = verdict("racecheck", "planted-clean", RunOutputs(None, 60.0, timed_out=True))
    assert result.problem.code == "timeout" and result.status == "failed" and not result.ok


# -- summary lines --------------------------------------------------------------------------------

@pytest.mark.parametrize("text, errors, warnings, displayed", [
    ("========= ERROR SUMMARY: 1 error\n", 1, None, None),
    ("========= ERROR SUMMARY: 2 errors\n", 2, None, None),
    ("========= ERROR SUMMARY: 0 errors\n", 0, None, None),
    ("========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n", 0, 0, 0),
    ("========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)\n", 1, 0, 1),
    ("========= RACECHECK SUMMARY: 2 hazards displayed (1 error, 1 warning)\n", 1, 1, 2),
    ("========= ERROR SUMMARY: 256 errors\n========= ERROR SUMMARY: 156 errors were not printed. Use --print-limit\n",
     256, None, None),
    ("========= ERROR SUMMARY: 1 error\n========= ERROR SUMMARY: 2 errors\n", 3, None, None),  # two processes
])
def test_summary_lines_singular_plural_and_per_process(text, errors, warnings, displayed):
    summary = parse_summary(text)
    assert (summary.errors, summary.warnings, summary.displayed) == (errors, warnings, displayed)


def test_no_summary_line_raises():
    with pytest.raises(OutputError) as err:
        parse_summary("========= COMPUTE-SANITIZER\n========= Target application returned an error\n")
    assert err.value.code == "no-summary"


# -- the command line -----------------------------------------------------------------------------

def test_command_has_what_pytorch_and_triton_programs_need(tmp_path):
    inv = build_command("cs", "memcheck", CASES["planted-oob"], tmp_path)
    argv = inv.argv
    for flag, value in [("--tool", "memcheck"), ("--target-processes", "all"), ("--error-exitcode", "86"),
                        ("--save", str(inv.xml_path)), ("--log-file", str(inv.log_path)),
                        ("--kernel-name", "regex=planted_oob")]:
        assert argv[argv.index(flag) + 1] == value
    assert "--xml" in argv and "--launch-timeout" in argv
    assert argv[argv.index("--sentinel") + 1] == str(inv.sentinel_path)
    assert inv.env["PYTORCH_NO_CUDA_MEMORY_CACHING"] == "1"


def test_graph_cases_keep_the_caching_allocator_and_racecheck_reports_hazards(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTORCH_NO_CUDA_MEMORY_CACHING", raising=False)
    inv = build_command("cs", "racecheck", CASES["metadata-graph-2req"], tmp_path)
    assert inv.argv[inv.argv.index("--racecheck-report") + 1] == "hazard" and "--kernel-name" not in inv.argv
    assert "PYTORCH_NO_CUDA_MEMORY_CACHING" not in build_command("cs", "memcheck", CASES["metadata-graph-2req"],
                                                                 tmp_path).env


def test_unknown_tool_names_the_allowed_ones(tmp_path):
    with pytest.raises(InvalidArgument, match="racecheck, synccheck, memcheck, initcheck"):
        build_command("cs", "leakcheck", CASES["planted-clean"], tmp_path)


# -- finding the binary ---------------------------------------------------------------------------

def _fake_binary(path: Path, body: str, interpreter: str = "/bin/sh") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{interpreter}\n{body}")
    path.chmod(0o755)
    return path


VERSION_BODY = f"while IFS= read -r line; do echo \"$line\"; done < '{DATA / 'version.txt'}'\n"  # PATH may be empty


@pytest.fixture
def bare_machine(tmp_path, monkeypatch):
    """No compute-sanitizer anywhere: an empty PATH, no CUDA install, no pip package."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(binary_mod.glob, "glob", lambda pattern: [])
    monkeypatch.setattr(sys, "path", [str(tmp_path / "site")])
    return tmp_path


def test_missing_binary_is_a_broken_environment(bare_machine):
    with pytest.raises(EnvironmentBroken, match="compute-sanitizer not found: not on PATH"):
        binary_mod.find_sanitizer()


def test_binary_on_path(bare_machine, monkeypatch):
    _fake_binary(bare_machine / "bin" / "compute-sanitizer", VERSION_BODY)
    monkeypatch.setenv("PATH", str(bare_machine / "bin"))
    found = binary_mod.find_sanitizer()
    assert (found.source, found.version) == ("PATH", "2025.3.1.0")


def test_binary_under_cuda_home(bare_machine, monkeypatch):
    _fake_binary(bare_machine / "cuda" / "bin" / "compute-sanitizer", VERSION_BODY)
    monkeypatch.setenv("CUDA_HOME", str(bare_machine / "cuda"))
    assert binary_mod.find_sanitizer().source == "CUDA_HOME"


def test_binary_from_a_pip_package(bare_machine):
    fake = _fake_binary(bare_machine / "site" / "nvidia" / "cuda_sanitizer_api" / "bin" / "compute-sanitizer",
                        VERSION_BODY)
    found = binary_mod.find_sanitizer()
    assert (found.source, found.path) == ("pip", str(fake))


def test_binary_without_a_version_line_is_broken(bare_machine, monkeypatch):
    _fake_binary(bare_machine / "bin" / "compute-sanitizer", "echo hello\n")
    monkeypatch.setenv("PATH", str(bare_machine / "bin"))
    with pytest.raises(EnvironmentBroken, match="without a version line"):
        binary_mod.find_sanitizer()


# -- the runner and the command, through a fake sanitizer that replays a recording ----------------

REPLAY_BODY = """import os, shutil, sys, time
argv = sys.argv[1:]
if argv == ["--version"]:
    print(open(os.environ["FAKE_VERSION"]).read()); sys.exit(0)
time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
stem = os.environ["FAKE_RECORDING"]
for suffix, flag in ((".xml", "--save"), (".log", "--log-file"), (".sentinel.json", "--sentinel")):
    if os.path.exists(stem + suffix):
        shutil.copy(stem + suffix, argv[argv.index(flag) + 1])
sys.exit(int(os.environ["FAKE_EXIT"]))
"""


@pytest.fixture
def replaying(tmp_path, monkeypatch):
    fake = _fake_binary(tmp_path / "bin" / "compute-sanitizer", REPLAY_BODY, sys.executable)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_VERSION", str(DATA / "version.txt"))

    def use(name: str, exit_code: int | None = None) -> None:
        monkeypatch.setenv("FAKE_RECORDING", str(DATA / name))
        monkeypatch.setenv("FAKE_EXIT", str(RUNS[name]["exit_code"] if exit_code is None else exit_code))

    return use


def test_a_run_past_its_timeout_is_killed_and_failed(replaying, tmp_path, monkeypatch):
    replaying("racecheck-planted-clean")
    monkeypatch.setenv("FAKE_SLEEP", "30")
    result = run_sanitized(binary_mod.find_sanitizer(), "racecheck", CASES["planted-clean"], tmp_path, timeout=0.5)
    assert result.problem.code == "timeout" and result.seconds < 10


def test_stale_outputs_of_an_earlier_run_are_never_read(replaying, tmp_path, monkeypatch):
    replaying("racecheck-planted-clean")
    binary = binary_mod.find_sanitizer()
    assert run_sanitized(binary, "racecheck", CASES["planted-clean"], tmp_path, timeout=30).status == "clean"
    monkeypatch.setenv("FAKE_RECORDING", str(tmp_path / "nothing-recorded"))  # the next run writes no file
    assert run_sanitized(binary, "racecheck", CASES["planted-clean"], tmp_path, timeout=30).problem.code == "no-xml"


def test_sanitize_command_writes_the_report_and_exits_by_verdict(replaying, tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "run_plain", lambda case, out_dir, timeout: PlainRun(2.0, 0.5, None))
    replaying("racecheck-planted-race")
    assert main(["sanitize", "--tool", "racecheck", "planted-race", "--report-dir", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "sanitizer.json").read_text())
    assert report["binary"]["source"] == "PATH" and report["binary"]["version"] == "2025.3.1.0" and report["ok"]
    (row,) = report["results"]
    assert {k: row[k] for k in ("tool", "case", "status", "problem", "expected", "errors")} == {
        "tool": "racecheck", "case": "planted-race", "status": "found", "problem": None, "expected": "race",
        "errors": 1024}
    assert row["findings"][0]["kind"] == "race" and row["plain_seconds"] == 2.0
    assert row["slowdown"] == round(row["seconds"] / 2.0, 2)
    assert set(row["findings"][0]) == {"kind", "kernel", "location", "thread", "block", "address", "access",
                                       "severity", "message"}
    assert report["figures"]["racecheck"]["planted_found"] == 1
    assert (tmp_path / "sanitizer" / row["raw"]["xml"]).is_file()

    replaying("racecheck-planted-clean")  # the planted race not reported: the run cannot vouch, exit 3
    assert main(["sanitize", "--tool", "racecheck", "planted-race", "--report-dir", str(tmp_path)]) == 3


def test_sanitize_command_bad_input_and_missing_binary(bare_machine, tmp_path, capsys):
    assert main(["sanitize", "--tool", "memcheck", "planted-race"]) == 2  # planted-race is racecheck's only
    assert "case 'planted-race' runs under racecheck only, not --tool=memcheck" in capsys.readouterr().err
    assert main(["sanitize", "--timeout", "0"]) == 2
    assert main(["sanitize", "--target", "vllm"]) == 2
    assert main(["sanitize", "sglang-kernels-eager"]) == 2  # SGLang's case without --target sglang
    assert "case 'sglang-kernels-eager' runs sglang's code: give --target=sglang" in capsys.readouterr().err
    assert main(["sanitize", "--tool", "racecheck", "planted-race", "--report-dir", str(tmp_path / "r")]) == 3
    assert "not found" in json.loads((tmp_path / "r" / "sanitizer.json").read_text())["error"]


def test_the_report_recorded_on_the_gpu_has_the_shape_this_code_writes():
    """`sanitize --tool all --jobs 8` on an H200: every planted bug found by its tool, no error in a
    clean case. If the row format changes, this recorded report is stale: record it again."""
    report = json.loads((DATA / "sanitizer-h200.json").read_text())
    row = classify_run("racecheck", CASES["planted-race"], recorded("racecheck-planted-race"), timeout=60).as_dict()
    assert all(set(r) == set(row) for r in report["results"])
    assert report["ok"] and report["binary"]["source"] == "PATH" and len(report["results"]) == 40
    for tool, figures in report["figures"].items():
        assert (figures["planted_found"], figures["errors_in_clean_cases"], figures["failed"]) == (1, 0, 0), tool


def test_sglangs_kernels_recorded_on_the_gpu_clean_and_every_planted_bug_found():
    """`sanitize --target sglang --tool all --jobs 3` on an H200 (findings cut to three a row): SGLang's
    two kernels seen in each of its cases, no error in a clean case, each bug planted in SGLang's kernel
    file found by its tool in the kernel it was planted in."""
    report = json.loads((DATA / "sanitizer-sglang-h200.json").read_text())
    assert report["ok"] and report["target"] == "sglang" and len(report["results"]) == 26
    for row in report["results"]:
        assert row["ok"] and row["problem"] is None, row
        if row["case"].startswith("sglang-") and row["expected"] == "clean":
            assert row["errors"] == 0 and row["kernels_seen"] == list(SGLANG_KERNELS)
    planted = {r["case"]: r for r in report["results"] if r["case"].startswith("sglang-planted")}
    assert {name: (r["tool"], r["findings"][0]["kind"], r["findings"][0]["kernel"]) for name, r in planted.items()} \
        == {name: (tool, kind, kernel) for name, (tool, kind, kernel, _) in PLANTED_EDITS.items()}


@pytest.mark.parametrize("target", ["reference", "sglang"])
@pytest.mark.parametrize("tool", ["racecheck", "synccheck", "memcheck", "initcheck"])
def test_one_tool_runs_the_targets_cases_made_for_it(target, tool):
    # the planted bugs of the other tools are left out, not an error: `--tool memcheck` alone must run
    tools, cases = select(tool, target, [])
    assert tools == [tool] and cases and all(tool in case.tools for case in cases)
    with pytest.raises(InvalidArgument, match=f"runs under .* only, not tool={tool}$"):  # the parameter, not a flag
        select(tool, target, [next(c.name for c in cases_of(target) if tool not in c.tools)])
