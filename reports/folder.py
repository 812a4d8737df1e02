"""Read a report folder: every file the runs write, each JSON file validated by its schema (reports/schema.py).

A file that is absent is simply absent (the page leaves its section out), but a file that exists
and is not valid JSON, or lacks a field the page uses, or holds a field of the wrong type, is a
`ReportError` naming the file and the field: a truncated report must never render as a clean one.
What the page, the verdict and `merge` read is the file's data, a few parts put in one shape
(`summary_view`, `triage_view`, `kernel_view`).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import InvalidArgument
from reports.schema import (CLEAN_REFERENCE, KERNEL, MUTANTS, NIGHTLY, SANITIZER, SUMMARY, TRIAGE, VERSIONS,
                            ReportError, read_report)

SANITIZER_RAW_DIR = "sanitizer"  # the sanitizer's own XML and logs, beside sanitizer.json
PYTEST_JUNIT = "junit-pytest.xml"
EXAMPLES = "examples"


@dataclass
class PytestCase:
    name: str
    status: str  # passed | failed | error | skipped
    message: str = ""
    text: str = ""  # the full report (traceback) pytest put in the element
    seconds: float = 0.0
    properties: dict[str, str] = field(default_factory=dict)


@dataclass
class PytestRun:
    tests: int
    failures: int
    errors: int
    skipped: int
    seconds: float
    cases: list[PytestCase]

    @property
    def problems(self) -> list[PytestCase]:
        return [c for c in self.cases if c.status in ("failed", "error")]


@dataclass
class ReportFolder:
    path: Path
    summary: dict | None = None
    mutants: list[dict] | None = None
    clean_reference: dict | None = None  # the kill table's campaign on the clean reference
    triage: dict | None = None
    sanitizer: dict | None = None
    kernel: dict | None = None  # {"rows": [flat rows], "meta": {fact: value}}, whatever shape the file had
    nightly: dict | None = None
    versions: dict | None = None
    pytest: PytestRun | None = None
    examples: int | None = None  # entries in the hypothesis example database, None when there is none
    shown_as: Path | None = None  # the folder's name in printed commands, when it is read from a staging copy

    @property
    def display_path(self) -> Path:
        return self.shown_as or self.path

    @property
    def empty(self) -> bool:
        return not any((self.summary, self.mutants is not None, self.triage, self.sanitizer, self.kernel, self.pytest,
                        self.nightly, self.versions))


def summary_view(summary: dict) -> dict:
    """A campaign as the page, the verdict and `merge` read it: its telemetry in one shape."""
    if summary.get("telemetry") is None:
        return summary
    return {**summary, "telemetry": telemetry_view(summary["telemetry"])}


def telemetry_view(telemetry: dict) -> dict:
    """NVML telemetry in either of its shapes (reports/schema.py `Telemetry`) as {gpus, suspect, reasons,
    unavailable}: one record as a run writes it (`available`, `suspect_reasons`, ...), or one per GPU."""
    if "gpus" in telemetry:
        return {"gpus": telemetry["gpus"], "suspect": telemetry["suspect"], "reasons": telemetry["reasons"],
                "unavailable": None}
    available, reasons = telemetry["available"], telemetry["suspect_reasons"]
    return {"gpus": [telemetry] if available else [], "suspect": bool(reasons), "reasons": reasons,
            "unavailable": None if available else telemetry.get("reason") or "no reason given"}


def triage_view(triage: dict) -> dict:
    """A triage with every list the page reads (`--static-only` writes no contract breaks, an older one no
    static part) and its campaign as `summary_view` gives it."""
    campaign = triage.get("campaign")
    return {"contract_breaks": [], "static_breaks": [], "static_unknowable": [], "static_missing_modules": [],
            **triage, "campaign": campaign and summary_view(campaign)}


def kernel_view(kernel: dict | list) -> dict:
    """A kernel benchmark as flat rows (`name`, `tokens`, `ms`, ...) and facts: a row that holds one object
    per implementation (`tokens`, `triton: {ms, ...}`, `torch: {...}`, as benchmarks/sparse_kernel.py
    writes) becomes a row per implementation. The other top-level fields are facts: scalars, one level of
    objects, and lists by their length."""
    if isinstance(kernel, list):
        kernel = {"rows": kernel}
    rows = []
    for row in kernel["rows"]:
        scalars = {k: v for k, v in row.items() if not isinstance(v, (dict, list))}
        per_implementation = [{"name": k, **scalars, **v} for k, v in row.items() if isinstance(v, dict) and "ms" in v]
        rows += [{k: v for k, v in flat.items() if not isinstance(v, (dict, list))}
                 for flat in per_implementation or [scalars]]
    facts = {}
    for key, value in kernel.items():
        if key == "rows":
            continue
        if isinstance(value, dict):
            facts.update({f"{key}.{k}": v for k, v in value.items() if not isinstance(v, (dict, list))})
        elif isinstance(value, list):
            facts[key] = f"{len(value)} entr{'y' if len(value) == 1 else 'ies'}"
        else:
            facts[key] = value
    return {"rows": rows, "meta": facts}


def read_pytest_junit(path: Path) -> PytestRun:
    """pytest's own JUnit XML (--junitxml): the counts and each test's outcome and properties."""
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        line, column = exc.position
        raise ReportError(f"{path.name}: not well-formed XML (line {line} column {column})") from None
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    if root.tag not in ("testsuite", "testsuites") or not suites:
        raise ReportError(f"{path.name}: no <testsuite> element (root is <{root.tag}>)")
    totals = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
    seconds, cases = 0.0, []
    for suite in suites:
        for key in totals:
            try:
                totals[key] += int(suite.get(key, "0"))
            except ValueError:
                raise ReportError(f"{path.name}: <testsuite {key}={suite.get(key)!r}> is not an integer") from None
        seconds += float(suite.get("time", "0") or 0)
        for case in suite.iter("testcase"):
            status, message, text = "passed", "", ""
            for tag, name in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
                node = case.find(tag)
                if node is not None:
                    status, message, text = name, node.get("message") or "", (node.text or "").strip()
                    break
            props = {p.get("name", ""): p.get("value", "") for p in case.iter("property")}
            name = ".".join(filter(None, (case.get("classname"), case.get("name"))))
            cases.append(PytestCase(name, status, message, text, float(case.get("time", "0") or 0), props))
    return PytestRun(seconds=seconds, cases=cases, **totals)


def _as_written(data):
    """A file the page reads as it was written."""
    return data


# each JSON file, the folder's attribute that holds it, and the shape it is read in
_FILES = ((SUMMARY, "summary", summary_view), (MUTANTS, "mutants", _as_written),
          (CLEAN_REFERENCE, "clean_reference", _as_written), (TRIAGE, "triage", triage_view),
          (SANITIZER, "sanitizer", _as_written), (KERNEL, "kernel", kernel_view), (NIGHTLY, "nightly", _as_written),
          (VERSIONS, "versions", _as_written))


def load_folder(path: Path, pytest_junit: Path | None = None) -> ReportFolder:
    """`pytest_junit`: where pytest wrote its JUnit XML, when not in the folder as junit-pytest.xml."""
    path = Path(path)
    if not path.is_dir():
        raise InvalidArgument(f"report folder {path}: no such directory")
    folder = ReportFolder(path)
    for name, attr, view in _FILES:
        file = path / name
        if file.is_file():
            setattr(folder, attr, view(read_report(file)))
    if pytest_junit is not None and not Path(pytest_junit).is_file():
        raise ReportError(f"{Path(pytest_junit).name}: pytest's JUnit XML was not written")
    junit = Path(pytest_junit) if pytest_junit else path / PYTEST_JUNIT
    if junit.is_file():
        folder.pytest = read_pytest_junit(junit)
    if (path / EXAMPLES).is_dir():
        folder.examples = sum(1 for p in (path / EXAMPLES).rglob("*") if p.is_file())
    return folder


def time_rows(spent: dict) -> list[tuple[str, float, float]]:
    """A summary's `time` as (phase, seconds, share of the total) rows, largest first: the page's table
    and the run's printed line."""
    total = sum(spent.values()) or 1.0
    return [(phase.replace("_", " "), seconds, seconds / total)
            for phase, seconds in sorted(spent.items(), key=lambda item: -item[1])]
