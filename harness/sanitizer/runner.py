"""Run cases under compute-sanitizer, one tool at a time, and judge each run with no silent pass.

`classify_run` is pure: it takes what one run left behind (exit code, XML, log, sentinel) and returns a
typed result. Every way a run can fail to prove anything has its own problem code:

    timeout              the run exceeded the wall-clock limit
    no-xml               no `--save` XML file was written
    malformed-xml        the XML is empty, truncated or not the sanitizer's
    no-summary           the log has no summary line: the tool did not finish
    summary-mismatch     the XML and the summary line disagree on how many records were displayed
    never-ran            the case's kernels did not run to completion under the tool (no sentinel, a
                         failure before launch, or a launch that never completed and no finding names it)
    kernel-filtered-out  a kernel the case ran is not matched by the --kernel-name filter, so the tool
                         never checked it
    exit-without-errors  a non-zero exit, but the tool reported no error
    exit-mismatch        the tool reported errors but did not exit with --error-exitcode
    planted-not-found    a planted bug's tool did not report it in the planted kernel
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import EnvironmentBroken
from harness.sanitizer.binary import SanitizerBinary
from harness.sanitizer.cases import CLEAN, SanitizerCase
from harness.sanitizer.command import (
    ERROR_EXITCODE,
    PRINT_LIMIT,
    build_command,
    driver_argv,
    driver_env,
)
from harness.sanitizer.parse import Finding, OutputError, parse_summary, parse_xml

_TAIL = 400


@dataclass(frozen=True)
class Problem:
    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


@dataclass
class RunOutputs:
    """What one sanitized run left behind; None where a file was not written."""

    exit_code: int | None
    seconds: float
    timed_out: bool = False
    xml: str | None = None
    log: str | None = None
    sentinel: dict | None = None
    stderr: str = ""


@dataclass
class PlainRun:
    seconds: float
    body_seconds: float | None
    error: str | None


@dataclass
class ToolResult:
    tool: str
    case: str
    status: str  # clean | found | failed
    problem: Problem | None
    exit_code: int | None
    errors: int
    warnings: int
    seconds: float
    findings: list[Finding]
    expected: str
    replay: str
    kernels_seen: list[str] = field(default_factory=list)
    truncated: bool = False  # the tool counted more errors than it displayed (--print-limit)
    body_seconds: float | None = None
    plain_seconds: float | None = None
    plain_body_seconds: float | None = None
    plain_error: str | None = None
    raw: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """A clean case came out clean, or a planted bug was found."""
        return self.status == (CLEAN if self.expected == CLEAN else "found")

    @property
    def slowdown(self) -> float | None:
        return round(self.seconds / self.plain_seconds, 2) if self.plain_seconds else None

    def as_dict(self) -> dict:
        return {"tool": self.tool, "case": self.case, "status": self.status, "ok": self.ok,
                "problem": str(self.problem) if self.problem else None, "exit_code": self.exit_code,
                "errors": self.errors, "warnings": self.warnings, "truncated": self.truncated,
                "seconds": self.seconds, "plain_seconds": self.plain_seconds, "slowdown": self.slowdown,
                "body_seconds": self.body_seconds, "plain_body_seconds": self.plain_body_seconds,
                "plain_error": self.plain_error, "kernels_seen": self.kernels_seen,
                "findings": [f.as_dict() for f in self.findings], "expected": self.expected,
                "replay": self.replay, "raw": self.raw}


def replay_command(tool: str, case: SanitizerCase) -> str:
    target = f" --target {case.target}" if case.target not in ("reference", "any") else ""
    return f"python -m harness sanitize{target} --tool {tool} {case.name}"


def _tail(text: str | None) -> str:
    """Both ends of a long message: the exception's first line and the error at its end."""
    text = (text or "").strip()
    return f"{text[:_TAIL // 3]} ... {text[-_TAIL:]}" if len(text) > _TAIL + _TAIL // 3 else text


def classify_run(tool: str, case: SanitizerCase, out: RunOutputs, *, timeout: float) -> ToolResult:
    """The verdict on one sanitized run, from its outputs alone."""
    result = ToolResult(tool, case.name, "failed", None, out.exit_code, 0, 0, round(out.seconds, 3), [],
                        case.expected, replay_command(tool, case))
    if out.sentinel:
        result.body_seconds = out.sentinel.get("body_seconds")

    def fail(code: str, message: str) -> ToolResult:
        result.problem = Problem(code, message)
        return result

    if out.timed_out:
        return fail("timeout", f"no result after {timeout:g}s: the run was killed (raise --timeout, or make the case "
                               f"smaller; {tool} is slow on big inputs)")
    if out.xml is None:
        return fail("no-xml", f"the sanitizer wrote no XML file (exit {out.exit_code}): {_tail(out.log or out.stderr)}")
    try:
        findings = parse_xml(out.xml)
        summary = parse_summary(out.log or "")
    except OutputError as exc:
        return fail(exc.code, str(exc))
    result.findings, result.errors = findings, summary.errors
    result.warnings = summary.warnings if summary.warnings is not None else sum(f.severity == "warning"
                                                                               for f in findings)
    shown = summary.displayed if summary.displayed is not None else summary.errors
    result.truncated = shown > len(findings) or summary.errors > len(findings)
    capped = summary.displayed is None and len(findings) == PRINT_LIMIT < summary.errors
    if len(findings) != shown and not capped:
        return fail("summary-mismatch", f"the XML holds {len(findings)} record(s) but the summary line says "
                                        f"{shown} displayed ({summary.errors} error(s))")

    named = {f.kernel for f in findings if f.kernel}
    sentinel = out.sentinel or {}
    launched = list(sentinel.get("kernels") or [])
    done = bool(sentinel.get("synchronized"))
    result.kernels_seen = sorted(set(launched if done else []) | named)
    if summary.errors:
        # The findings are the result; a program the bug crashed (memcheck's out-of-bounds write
        # destroys the context) is their consequence, and the finding itself proves the kernel ran.
        if out.exit_code != ERROR_EXITCODE:
            return fail("exit-mismatch", f"{tool} reported {summary.errors} error(s) but exited {out.exit_code}, "
                                         f"not --error-exitcode {ERROR_EXITCODE}")
    else:
        # Nothing found: worth something only if the case's kernels provably ran, and were checked.
        if out.sentinel is None:
            return fail("never-ran", f"the driver wrote no sentinel: the case never ran its kernels "
                                     f"(exit {out.exit_code}): {_tail(out.stderr)}")
        if not launched:
            return fail("never-ran", f"the case failed before it reported the kernels it ran: "
                                     f"{_tail(sentinel.get('error'))}")
        if not done:
            return fail("never-ran", f"{', '.join(launched)} launched but never completed under {tool}, and no "
                                     f"finding names it: {_tail(sentinel.get('error'))}")
        unchecked = [k for k in launched if case.kernel_regex and not re.search(case.kernel_regex, k)]
        if unchecked:
            return fail("kernel-filtered-out", f"{', '.join(unchecked)} ran but --kernel-name "
                                               f"regex={case.kernel_regex} does not match it, so {tool} never "
                                               f"checked it")
        if out.exit_code != 0:
            return fail("exit-without-errors", f"exited {out.exit_code} but {tool} reported no error: the program "
                                               f"failed: {_tail(sentinel.get('error') or out.stderr)}")
    if case.expected_kind:
        where = case.finding_in or case.kernel_regex or ""
        hits = [f for f in findings if f.kind == case.expected_kind and f.kernel and re.search(where, f.kernel)]
        if not hits:
            kinds = sorted({f.kind for f in findings}) or ["nothing"]
            return fail("planted-not-found", f"the planted {case.expected_kind} was not reported by {tool} in "
                                             f"{where}; it reported: {', '.join(kinds)}")
    result.status = "found" if summary.errors else CLEAN
    return result


def _execute(argv: list[str], env: dict, timeout: float, stem: Path) -> tuple[int | None, float, bool, str]:
    """Run in its own process group, so a timeout kills the sanitizer and the program it started."""
    began = time.perf_counter()
    with open(stem.with_name(stem.name + ".stdout"), "w") as so, open(stem.with_name(stem.name + ".stderr"), "w") as se:
        try:
            proc = subprocess.Popen(argv, env=env, stdout=so, stderr=se, start_new_session=True)
        except OSError as exc:
            raise EnvironmentBroken(f"cannot start {argv[0]}: {exc}") from exc
        try:
            code, timed_out = proc.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            code, timed_out = proc.wait(), True
    stderr = stem.with_name(stem.name + ".stderr").read_text(errors="replace")
    return (None if timed_out else code), time.perf_counter() - began, timed_out, stderr


def _read(path: Path) -> str | None:
    return path.read_text(errors="replace") if path.is_file() else None


def _sentinel(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _clear(*paths: Path) -> None:
    """A stale file from an earlier run must never be read as this run's."""
    for path in paths:
        path.unlink(missing_ok=True)


def run_plain(case: SanitizerCase, out_dir: Path, timeout: float) -> PlainRun:
    stem = out_dir / f"plain-{case.name}"
    sentinel = stem.with_name(stem.name + ".sentinel.json")
    _clear(sentinel)
    code, seconds, timed_out, stderr = _execute(driver_argv(case, sentinel), driver_env(None, case), timeout, stem)
    record = _sentinel(sentinel) or {}
    error = None
    if timed_out:
        error = f"timeout after {timeout:g}s"
    elif code != 0 or not record.get("synchronized"):
        error = record.get("error") or f"exit {code}: {_tail(stderr)}"
    return PlainRun(round(seconds, 3), record.get("body_seconds"), error)


def run_sanitized(binary: SanitizerBinary, tool: str, case: SanitizerCase, out_dir: Path, *, timeout: float,
                  slot: int = 0, plain: PlainRun | None = None) -> ToolResult:
    inv = build_command(binary.path, tool, case, out_dir, slot=slot)
    _clear(inv.xml_path, inv.log_path, inv.sentinel_path)
    stem = inv.xml_path.with_suffix("")
    code, seconds, timed_out, stderr = _execute(inv.argv, inv.env, timeout, stem)
    outputs = RunOutputs(code, seconds, timed_out, _read(inv.xml_path), _read(inv.log_path),
                         _sentinel(inv.sentinel_path), stderr)
    result = classify_run(tool, case, outputs, timeout=timeout)
    result.raw = {kind: path.name for kind, path in (("xml", inv.xml_path), ("log", inv.log_path),
                                                     ("sentinel", inv.sentinel_path)) if path.is_file()}
    if plain:
        result.plain_seconds, result.plain_body_seconds, result.plain_error = (plain.seconds, plain.body_seconds,
                                                                               plain.error)
    return result


def run_all(binary: SanitizerBinary, tools: list[str], cases: list[SanitizerCase], out_dir: Path, *,
            timeout: float, jobs: int = 1, on_result: Callable[[ToolResult], None] = lambda r: None
            ) -> list[ToolResult]:
    """The plain runs first, then one tool at a time over its cases, up to `jobs` cases at once.

    Each case runs plain twice and the second is timed: the first fills Triton's and cupy's compile
    caches, which every sanitized run then finds warm, so the slowdown is the tool's and not a compile.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(lambda c: run_plain(c, out_dir, timeout), cases))
        plains = dict(zip([c.name for c in cases], pool.map(lambda c: run_plain(c, out_dir, timeout), cases)))
        results = []
        for tool in tools:
            todo = [c for c in cases if tool in c.tools]
            futures = [pool.submit(run_sanitized, binary, tool, c, out_dir, timeout=timeout, slot=i,
                                   plain=plains[c.name]) for i, c in enumerate(todo)]
            for future in futures:
                results.append(future.result())
                on_result(results[-1])
    return results
