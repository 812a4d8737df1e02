"""Which statements and functions of SGLang's DeepSeek-V4 prefill path a `--target sglang` campaign runs.

A clean campaign says nothing about code it never reached: a gate that no case closes, a runner method
the target stands in for, a graph path it never replays. This runs the campaign as a user starts it,
under coverage.py restricted to the installed sglang package, and prints for each file of the prefill
path the statements run out of its total, and for each function of the publish / snapshot / replay
protocol whether any statement of its body ran (its lines found with `ast` on the installed source,
so a method another version moved between these files is still found, and one it lacks is named as
absent). Child processes are measured too (coverage's `patch = subprocess`): an isolated run
(`--isolate SECONDS`, the default on CUDA) judges each case in a child; on the CPU the default is one
process.

    python benchmarks/sglang_coverage.py [--examples N] [--seed S] [--device cpu|cuda|auto]
                                         [--semantics pr|0.5.23] [--isolate SECONDS|off|auto]
                                         [--keep-going N] [--report-dir DIR] [--timeout SECONDS] [--json FILE]

The figure is over every case asked for: the campaign goes on past a finding (`--keep-going`, by default as many
as the cases), and its report, findings and replay commands included, is kept in `--report-dir`.

Exit 0 when the campaign ran (whether or not it found something: the finding count is printed), 3 when
coverage is missing, the campaign could not run to its end, or coverage measured nothing of sglang.

Needs sglang and coverage (>= 7.10, for `patch = subprocess`) installed in this environment (the CI's
`.venv-sglang`: `.venv-sglang/bin/pip install coverage`).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version
from pathlib import Path

from harness.errors import ExitCode

try:  # an optional dependency of the harness: only this benchmark needs it, and says so when it is missing
    import coverage
    from coverage.data import CoverageData
except ImportError:
    coverage = None

# The prefill path's files, relative to the sglang package; those a version lacks are reported as absent.
PREFILL_FILES = (
    "srt/layers/attention/deepseek_v4_backend.py",
    "srt/model_executor/runner/prefill_cuda_graph_runner.py",
    "srt/model_executor/runner/eager_runner.py",
    "srt/managers/scheduler.py",
    "srt/model_executor/cuda_graph_buffer_registry.py",
    "srt/model_executor/runner_utils/shared_read_event.py",
    "srt/layers/attention/dsv4/sparse_prefill_utils.py",
    "srt/layers/attention/base_attn_backend.py",
    "srt/mem_cache/deepseek_v4_memory_pool.py",
    "srt/speculative/eagle_draft_extend_cuda_graph_runner.py",
)

# The protocol's functions, by qualified name, looked up in every file above (the first that defines it).
PREFILL_FUNCTIONS = (
    "DeepseekV4AttnBackend.__init__",
    "DeepseekV4AttnBackend.init_forward_metadata",
    "DeepseekV4AttnBackend._build_forward_metadata",
    "DeepseekV4AttnBackend.init_forward_metadata_prefill",
    "DeepseekV4AttnBackend.make_core_attn_metadata",
    "DeepseekV4AttnBackend.init_forward_metadata_in_graph",
    "DeepseekV4AttnBackend.init_forward_metadata_out_graph",
    "DeepseekV4AttnBackend.forward",
    "DeepseekV4AttnBackend._forward_attention",
    "DeepseekV4AttnBackend._forward_prefill_sparse",
    "DeepseekV4AttnBackend.get_swa_out_cache_loc",
    "DeepseekV4AttnBackend._snapshot_prefill_shared_reads",
    "DeepseekV4AttnBackend.prepare_prefill_shared_read_snapshot",  # PR-era
    "DeepseekV4AttnBackend._build_sparse_prefill_chunk_cache",
    "DeepseekV4AttnBackend._use_sparse_prefill",
    "DeepseekV4AttnBackend.shared_read_ends",
    "DeepseekV4AttnBackend.init_forward_metadata_for_breakable_cuda_graph_capture",
    "DeepseekV4AttnBackend.prepare_forward_metadata_for_breakable_cuda_graph_replay",
    "DSV4AttnMetadata.init_flashmla_related",
    "DSV4AttnMetadata.init_compression_metadata",
    "DSV4AttnMetadata.copy_",
    "DSV4AttnMetadata.refresh_for_breakable_cuda_graph_replay_",
    "DSV4Metadata.copy_",
    "DSV4Metadata.refresh_for_breakable_cuda_graph_replay_",
    "AttentionBackend.shared_read_ends",
    "AttentionBackend.resolve_prefill_shared_read_ends",
    "AttentionBackend._snapshot_prefill_shared_reads",
    "SparsePrefillChunkCache.build",
    "PrefillCudaGraphRunner.__init__",
    "PrefillCudaGraphRunner.can_run_graph",
    "PrefillCudaGraphRunner.capture_one_shape",
    "PrefillCudaGraphRunner.execute",
    "PrefillCudaGraphRunner.load_batch",
    "PrefillCudaGraphRunner._prepare_forward_metadata_for_replay",
    "build_prefill_registry",
    "CudaGraphBufferRegistry.fill_from",
    "EagerRunner.execute",
    "EagerRunner._execute_extend",
    "maybe_publish_prefill_shared_read_done",
    "Scheduler._apply_war_barrier",
    # EAGLE's draft extend after a verify (the step's last reader of the shared tables), eager and replayed
    "DeepseekV4AttnBackend.init_forward_metadata_draft_extend",
    "EAGLEDraftExtendCudaGraphRunner.capture_one_shape",
    "EAGLEDraftExtendCudaGraphRunner.execute",
)

# coverage.py's settings for the campaign and every Python child it starts (patch = subprocess hands
# them on through COVERAGE_PROCESS_CONFIG; _exit saves the data of a child that leaves by os._exit).
RC_TEMPLATE = """\
[run]
source = {source}
parallel = True
data_file = {data_file}
patch = subprocess, _exit
"""


class Refused(Exception):
    """The run cannot vouch for a coverage figure: the reason, for stderr, and exit 3."""


@dataclass(frozen=True)
class Campaign:
    """The campaign as run: its argv (and a display form without the scratch folder), its wall time, exit and summary."""

    argv: list
    display: str
    seconds: float
    exit_code: int
    summary: dict
    result_line: str
    found: list  # the campaign's finding and replay lines, as it printed them


def sglang_package() -> Path:
    """The installed sglang's folder, found without importing it (importing it here would cost seconds
    and measure nothing: the campaign runs in its own process)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise Refused("sglang is not installed in this environment (see harness/sglang_target/requirements-cpu.txt)")
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def sglang_version() -> str:
    """The distribution's version, as the figures are tied to one sglang (the harness prints the same)."""
    try:
        return dist_version("sglang")
    except PackageNotFoundError:
        return "unknown (no distribution metadata)"


def harness_argv(args, report_dir: Path) -> list:
    """`python -m harness run --target sglang ...`'s arguments after `-m harness`, with the passthrough options."""
    argv = ["run", "--target", "sglang", "--device", args.device, "--examples", str(args.examples),
            "--seed", str(args.seed), "--report-dir", str(report_dir), "--overwrite",
            "--keep-going", str(args.keep_going or args.examples)]
    if args.semantics is not None:
        argv += ["--semantics", args.semantics]
    if args.isolate is not None:
        argv += ["--isolate", args.isolate]
    return argv


def run_campaign(args, rc: Path, report_dir: Path, scratch: Path) -> Campaign:
    """The campaign under `coverage run`; refused when it did not run to its end (exit 0 or 1 with a summary,
    and a finding to show for 1), since a partial run's coverage would read as the code the fuzzer misses."""
    argv = [sys.executable, "-m", "coverage", "run", f"--rcfile={rc}", "-m", "harness"] + harness_argv(args, report_dir)
    display = " ".join(shlex.quote(a) for a in ["python"] + argv[1:]).replace(str(scratch), "$SCRATCH")
    began = time.perf_counter()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=args.timeout, check=False)
    except subprocess.TimeoutExpired:
        raise Refused(f"the campaign ran past --timeout {args.timeout:g} s and was stopped: no coverage figure") from None
    seconds = time.perf_counter() - began
    output = (done.stdout or "") + (done.stderr or "")
    tail = "\n".join(output.strip().splitlines()[-8:])
    try:
        summary = json.loads((report_dir / "summary.json").read_text())
    except (OSError, ValueError):
        summary = None
    if done.returncode not in (ExitCode.OK, ExitCode.FOUND) or summary is None:
        raise Refused(f"the campaign did not run to its end (exit {done.returncode}"
                      f"{'' if summary else ', no summary.json'}), so its coverage is not a figure:\n{tail}")
    if done.returncode == ExitCode.FOUND and not summary.get("findings"):
        raise Refused(f"the campaign exited 1 (found) with no finding in its summary:\n{tail}")
    result = next((line for line in output.splitlines() if " cases on " in line), "")
    found = [line.strip() for line in output.splitlines() if line.startswith(("  [", "  replay: "))]
    return Campaign(argv, display, seconds, done.returncode, summary, result.strip(), found)


def processes_measured(data_dir: Path, package: Path) -> tuple[int, int]:
    """How many processes wrote coverage data, and how many of them ran sglang code: a child the campaign
    started (an isolated case runner) shows up here as a second data file."""
    files = sorted(data_dir.glob(".coverage.*"))
    with_sglang = 0
    for path in files:
        data = CoverageData(basename=str(path))
        data.read()
        with_sglang += any(Path(f).is_relative_to(package) for f in data.measured_files())
    return len(files), with_sglang


def combined(rc: Path, data_dir: Path, package: Path) -> coverage.Coverage:
    """Every process's data in one; refused when no process measured a line of sglang (a wrong --source,
    or a campaign that never imported the target would otherwise print 0% as if it were a result)."""
    cov = coverage.Coverage(config_file=str(rc))
    try:
        cov.combine([str(data_dir)], strict=True)
    except coverage.exceptions.NoDataError as exc:
        raise Refused(f"coverage collected no data for the campaign ({exc})") from None
    cov.save()
    measured = [f for f in cov.get_data().measured_files() if Path(f).is_relative_to(package)]
    if not measured:
        raise Refused(f"coverage collected no data for the sglang package ({package.name}, the installed one): "
                      "the campaign ran none of its code under the tracer")
    return cov


def file_rows(cov: coverage.Coverage, package: Path) -> list[dict]:
    """Statements run / total per prefill file, with the lines never run (for the JSON)."""
    rows = []
    for relative in PREFILL_FILES:
        path = package / relative
        if not path.exists():
            rows.append({"file": relative, "present": False})
            continue
        _, statements, _, missing, missing_text = cov.analysis2(str(path))
        run = len(statements) - len(missing)
        rows.append({"file": relative, "present": True, "statements": len(statements), "run": run,
                     "percent": round(100.0 * run / len(statements), 1) if statements else 0.0,
                     "missing_lines": missing_text})
    return rows


def function_spans(source: str) -> dict[str, list[tuple[int, int]]]:
    """Each function's qualified name (`Class.method`, nested classes dotted) and its body's line span.

    The body starts at its first statement: the `def` line and decorators run when the class or module is
    imported, so they would mark every function as entered."""
    spans: dict[str, list[tuple[int, int]]] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                spans.setdefault(name, []).append((child.body[0].lineno, child.end_lineno))
                visit(child, f"{name}.<locals>.")

    visit(ast.parse(source), "")
    return spans


def function_rows(cov: coverage.Coverage, package: Path) -> list[dict]:
    """Entered or not for each protocol function: entered when any statement of its body ran."""
    found: dict[str, tuple[str, list[tuple[int, int]]]] = {}
    for relative in PREFILL_FILES:
        path = package / relative
        if not path.exists():
            continue
        for name, spans in function_spans(path.read_text()).items():
            found.setdefault(name, (relative, spans))
    analyses = {}
    rows = []
    for name in PREFILL_FUNCTIONS:
        if name not in found:
            rows.append({"function": name, "present": False})
            continue
        relative, spans = found[name]
        if relative not in analyses:
            _, statements, _, missing, _ = cov.analysis2(str(package / relative))
            analyses[relative] = (set(statements), set(statements) - set(missing))
        statements, executed = analyses[relative]
        body = {line for first, last in spans for line in range(first, last + 1)}
        rows.append({"function": name, "present": True, "file": relative, "line": spans[0][0],
                     "statements": len(body & statements), "run": len(body & executed),
                     "entered": bool(body & executed)})
    return rows


def print_report(result: dict) -> None:
    """The table as BENCHMARKS.md quotes it: the run and its command first, so a figure carries its origin."""
    print(f"sglang {result['sglang_version']}; campaign: {result['campaign']['result_line'] or '(no result line)'}")
    print(f"command: {result['command']}")
    print("  (SCRATCH: a temporary folder; its coveragerc: source = the installed sglang package, parallel, "
          "patch = subprocess, _exit)")
    campaign = result["campaign"]
    print(f"wall time {campaign['seconds']:.1f} s; exit {campaign['exit_code']}; {campaign['findings']} finding(s); "
          f"processes measured: {campaign['processes']} ({campaign['processes_with_sglang']} ran sglang code)")
    for line in campaign["found"]:
        print(f"  {line}")
    print(f"the campaign's report: {result['report_dir']}")
    print("\nstatements run / total per file (the statements run at import count too: def and class lines, constants)")
    print(f"{'file (under sglang/)':58} {'run':>6} {'total':>6} {'%':>6}")
    for row in result["files"]:
        if row["present"]:
            print(f"{row['file']:58} {row['run']:>6} {row['statements']:>6} {row['percent']:>5.1f}%")
        else:
            print(f"{row['file']:58} absent in this version")
    print(f"\n{'function':72} {'entered':>11}  statements run")
    for row in result["functions"]:
        if row["present"]:
            state = "entered" if row["entered"] else "NOT entered"
            print(f"{row['function']:72} {state:>11}  {row['run']}/{row['statements']}")
        else:
            print(f"{row['function']:72} absent in this version")
    entered = [r for r in result["functions"] if r["present"]]
    print(f"\n{sum(r['entered'] for r in entered)}/{len(entered)} present functions entered")


def measure(args) -> dict:
    """The campaign under coverage, combined and read back per file and per function."""
    if coverage is None:
        raise Refused("coverage.py is not installed in this environment (pip install coverage)")
    package = sglang_package()
    with tempfile.TemporaryDirectory(prefix="sglang-coverage-") as folder:
        scratch = Path(folder)
        data_dir, rc = scratch / "data", scratch / "coveragerc"
        data_dir.mkdir()
        rc.write_text(RC_TEMPLATE.format(source=package, data_file=data_dir / ".coverage"))
        campaign = run_campaign(args, rc, Path(args.report_dir).resolve(), scratch)
        processes, with_sglang = processes_measured(data_dir, package)
        cov = combined(rc, data_dir, package)
        files, functions = file_rows(cov, package), function_rows(cov, package)
    return {"sglang_version": sglang_version(), "command": campaign.display, "argv": campaign.argv,
            "date": time.strftime("%Y-%m-%d"), "report_dir": args.report_dir,
            "campaign": {"seconds": round(campaign.seconds, 1), "exit_code": campaign.exit_code,
                         "result_line": campaign.result_line, "cases": campaign.summary.get("cases"),
                         "findings": len(campaign.summary.get("findings") or []),
                         "jobs": campaign.summary.get("jobs"), "processes": processes, "found": campaign.found,
                         "processes_with_sglang": with_sglang},
            "files": files, "functions": functions}


def main() -> int:
    """Options, then the measurement; a refusal is exit 3 with its reason, never a table of zeros."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=100)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    parser.add_argument("--semantics", default=None, help="pr | 0.5.23 (passed on; the harness's default if left out)")
    parser.add_argument("--isolate", default=None, metavar="SECONDS|off|auto",
                        help="passed on to the campaign (the harness's default, auto, if left out)")
    parser.add_argument("--keep-going", type=int, default=None, metavar="N",
                        help="passed on: the distinct failures collected before the campaign stops (default: "
                             "--examples, so the figure is over every case)")
    parser.add_argument("--report-dir", default="sglang-coverage-report", metavar="DIR",
                        help="the campaign's report folder, kept (replaced when it holds an earlier campaign)")
    parser.add_argument("--timeout", type=float, default=7200.0, help="seconds the campaign may run")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the result as JSON")
    args = parser.parse_args()
    if args.examples < 1:
        parser.error(f"--examples={args.examples}: must be >= 1")
    if args.keep_going is not None and args.keep_going < 1:
        parser.error(f"--keep-going={args.keep_going}: must be >= 1")
    if args.timeout <= 0:
        parser.error(f"--timeout={args.timeout:g}: must be > 0 seconds")
    try:
        result = measure(args)
    except Refused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.BROKEN
    print_report(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
