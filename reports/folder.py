"""Read a report folder: every JSON file the runs write, validated field by field.

A file that is absent is simply absent (the page leaves its section out), but a file that exists
and is not valid JSON, or lacks a field the page uses, or holds a field of the wrong type, is a
`ReportError` naming the file and the field: a truncated report must never render as a clean one.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from harness.case import Flags
from harness.errors import InvalidArgument

SUMMARY, MUTANTS, TRIAGE, SANITIZER, KERNEL = "summary.json", "mutants.json", "triage.json", "sanitizer.json", "kernel.json"
SANITIZER_RAW_DIR = "sanitizer"  # the sanitizer's own XML and logs, beside sanitizer.json
CLEAN_REFERENCE = "mutants-clean.json"
NIGHTLY, VERSIONS = "nightly.json", "versions.json"
STEP_OUTCOMES = ("clean", "found", "broken", "skipped", "interrupted")
PYTEST_JUNIT = "junit-pytest.xml"
EXAMPLES = "examples"
SANITIZER_STATUSES = ("clean", "found", "failed")
CASE_OUTCOMES = ("clean", "found")

_TYPES = {"str": (str,), "int": (int,), "number": (int, float), "bool": (bool,), "list": (list,), "object": (dict,)}


class ReportError(InvalidArgument):
    """A report file exists but cannot be used; the message names the file and what is wrong."""


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


class _Check:
    """Field checks for one file; every error message starts with the file's name."""

    def __init__(self, name: str):
        self.name = name

    def fail(self, what: str):
        raise ReportError(f"{self.name}: {what}")

    def need(self, data: dict, key: str, kind: str, where: str = "", *, optional: bool = False,
             nullable: bool = False, allowed: tuple = ()):
        path = f"{where}{key}"
        if key not in data:
            if optional:
                return None
            self.fail(f"missing field '{path}'")
        value = data[key]
        if value is None and (nullable or optional):
            return None
        ok = isinstance(value, _TYPES[kind]) and not (kind in ("int", "number") and isinstance(value, bool))
        if not ok:
            self.fail(f"field '{path}' must be {'a list' if kind == 'list' else 'an object' if kind == 'object' else kind}"
                      f"{' or null' if nullable else ''}, got {json.dumps(value)[:60]}")
        if allowed and value not in allowed:
            self.fail(f"field '{path}' is {value!r}; allowed: {', '.join(allowed)}")
        return value

    def items(self, data: dict, key: str, where: str = "", *, optional: bool = False, kind: str = "object"):
        """The list under `key`, each item checked to be of `kind`; yields (prefix, item)."""
        values = self.need(data, key, "list", where, optional=optional) or []
        for i, item in enumerate(values):
            prefix = f"{where}{key}[{i}]"
            if not isinstance(item, _TYPES[kind]):
                self.fail(f"field '{prefix}' must be {'an object' if kind == 'object' else kind}, "
                          f"got {json.dumps(item)[:60]}")
            yield f"{prefix}.", item


def _read_json(path: Path):
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ReportError(f"{path.name}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReportError(f"{path.name}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None


def check_summary(check: _Check, data, where: str = "") -> dict:
    """The campaign's summary (harness/campaign.py CampaignResult.summary, plus the fields harness/commands/run.py adds)."""
    if not isinstance(data, dict):
        check.fail(f"{('field ' + repr(where.rstrip('.'))) if where else 'the top level'} must be an object")
    for key in ("target", "device", "semantics"):
        check.need(data, key, "str", where)
    check.need(data, "target_description", "str", where, optional=True)
    for prefix, name in check.items(data, "without", where, optional=True, kind="str"):
        if name not in Flags.GATES:
            check.fail(f"field '{prefix.rstrip('.')}' is {name!r}, not a gate switch; allowed: {', '.join(Flags.GATES)}")
    check.need(data, "cases", "int", where)
    check.need(data, "duration_s", "number", where)
    check.need(data, "seed", "int", where, optional=True)
    check.need(data, "profile", "str", where, optional=True)
    check.need(data, "mutant", "str", where, optional=True)
    check.need(data, "cases_per_second", "number", where, optional=True)
    list(check.items(data, "oracles", where, optional=True, kind="str"))
    first = check.need(data, "first_detection", "object", where, optional=True)
    if first is not None:
        check.need(first, "examples", "int", f"{where}first_detection.")
        check.need(first, "seconds", "number", f"{where}first_detection.")
    for prefix, finding in check.items(data, "findings", where):
        for key in ("oracle", "kind", "message", "case_summary", "replay"):
            check.need(finding, key, "str", prefix)
        check.need(finding, "severity", "str", prefix, optional=True)
        check.need(finding, "details", "object", prefix, optional=True)
        check.need(finding, "batch", "int", prefix, optional=True)
    for prefix, record in check.items(data, "cases_log", where, optional=True):
        check.need(record, "i", "int", prefix)
        check.need(record, "t", "number", prefix)
        check.need(record, "outcome", "str", prefix, allowed=CASE_OUTCOMES)
        check.need(record, "tokens", "int", prefix)
        check.need(record, "requests", "int", prefix)
        check.need(record, "graph", "bool", prefix)
        check.need(record, "spec", "str", prefix)
        check.need(record, "stream", "int", prefix, optional=True)
        check.need(record, "case", "str", prefix, optional=True)
    shard = check.need(data, "shard", "object", where, optional=True)
    if shard is not None:
        check.need(shard, "index", "int", f"{where}shard.")
        check.need(shard, "count", "int", f"{where}shard.")
    check.need(data, "interrupted", "str", where, optional=True)
    check.need(data, "replayed_from_db", "int", where, optional=True)
    check.need(data, "jobs", "int", where, optional=True)
    coverage = check.need(data, "coverage", "object", where, optional=True)
    if coverage is not None:
        check.need(coverage, "dimensions", "object", f"{where}coverage.")
        check.need(coverage, "unreached", "object", f"{where}coverage.")
        check.need(coverage, "combinations_reached", "int", f"{where}coverage.")
    time_spent = check.need(data, "time", "object", where, optional=True)
    for phase in time_spent or {}:
        check.need(time_spent, phase, "number", f"{where}time.")
    race_gates = check.need(data, "race_gates", "object", where, optional=True)
    for way in race_gates or {}:
        check.need(race_gates, way, "int", f"{where}race_gates.")
    check.need(data, "cuda_visible_devices", "str", where, optional=True)
    list(check.items(data, "shards_missing", where, optional=True, kind="int"))
    for prefix, row in check.items(data, "workers", where, optional=True):
        for key in ("folder", "shard"):
            check.need(row, key, "str", prefix)
        check.need(row, "cases", "int", prefix)
        check.need(row, "duration_s", "number", prefix)
        check.need(row, "cases_per_second", "number", prefix, optional=True)
        for key in ("cuda_visible_devices", "gpu"):
            check.need(row, key, "str", prefix, optional=True)
    telemetry = check.need(data, "telemetry", "object", where, optional=True)
    if telemetry is not None:
        data = {**data, "telemetry": check_telemetry(check, telemetry, f"{where}telemetry.")}
    return data


def check_telemetry(check: _Check, telemetry: dict, where: str) -> dict:
    """NVML telemetry in either shape, as {gpus, suspect, reasons, unavailable}: one record as
    harness/telemetry.py's TelemetryRecord.to_dict() writes it (`available`, `suspect_reasons`, ...),
    or one record per GPU (`gpus`, `suspect`, `reasons`)."""
    if "gpus" in telemetry:
        list(check.items(telemetry, "gpus", where))
        check.need(telemetry, "suspect", "bool", where)
        list(check.items(telemetry, "reasons", where, kind="str"))
        return {"gpus": telemetry["gpus"], "suspect": telemetry["suspect"], "reasons": telemetry["reasons"],
                "unavailable": None}
    if "available" not in telemetry:
        check.fail(f"field '{where.rstrip('.')}' has neither 'gpus' (records per GPU) nor 'available' (one NVML record)")
    available = check.need(telemetry, "available", "bool", where)
    reason = check.need(telemetry, "reason", "str", where, optional=True)
    reasons = list(check.items(telemetry, "suspect_reasons", where, kind="str"))
    return {"gpus": [telemetry] if available else [], "suspect": bool(reasons), "reasons": [r for _, r in reasons],
            "unavailable": None if available else reason or "no reason given"}


def check_mutants(check: _Check, data) -> list[dict]:
    """The kill table (harness/mutants/kill_table.py run_kill_table): one row per mutant."""
    if not isinstance(data, list):
        check.fail("the top level must be a list of mutant rows")
    for prefix, row in check.items({"rows": data}, "rows"):
        prefix = prefix.removeprefix("rows")
        check.need(row, "name", "str", prefix)
        check.need(row, "killed", "bool", prefix)
        list(check.items(row, "oracles", prefix, kind="str"))
        check.need(row, "examples_to_detect", "int", prefix, nullable=True)
        check.need(row, "seconds_to_detect", "number", prefix, nullable=True)
        for key in ("description", "expected_oracle", "minimal_case", "replay"):
            check.need(row, key, "str", prefix, optional=True)
        list(check.items(row, "contract_failures", prefix, optional=True, kind="str"))
    return data


def check_clean_reference(check: _Check, data) -> dict:
    """harness/mutants/kill_table.py: the clean reference through the kill table's campaign (it must find nothing)."""
    if not isinstance(data, dict):
        check.fail("the top level must be an object")
    check.need(data, "cases", "int")
    check.need(data, "findings", "int")
    check.need(data, "finding", "str", nullable=True)
    return data


def check_triage(check: _Check, data) -> dict:
    """harness/commands/triage.py: the contract breaks on the built object, the static breaks on the
    source, then a short campaign; `triage --static-only` writes the static part alone."""
    if not isinstance(data, dict):
        check.fail("the top level must be an object")
    check.need(data, "target", "str")
    static_only = check.need(data, "static_only", "bool", optional=True)
    for key in ("device", "semantics"):
        check.need(data, key, "str", optional=static_only)
    for prefix, b in check.items(data, "contract_breaks", optional=static_only):
        for key in ("cls", "attribute", "file"):
            check.need(b, key, "str", prefix)
        check.need(b, "line", "int", prefix)
        list(check.items(b, "call_path", prefix, kind="str"))
    for prefix, b in check.items(data, "static_breaks", optional=True):
        for key in ("cls", "attribute", "method", "file"):
            check.need(b, key, "str", prefix)
        check.need(b, "line", "int", prefix)
    for prefix, o in check.items(data, "static_unknowable", optional=True):
        for key in ("cls", "reason", "file"):
            check.need(o, key, "str", prefix)
    list(check.items(data, "static_missing_modules", optional=True, kind="str"))
    campaign = check.need(data, "campaign", "object", optional=static_only)
    return {"contract_breaks": [], "static_breaks": [], "static_unknowable": [], "static_missing_modules": [], **data,
            "campaign": campaign and check_summary(check, campaign, "campaign.")}


def check_versions(check: _Check, data) -> dict:
    """harness/triage/versions.py (`triage --versions`): the triage outcome per sglang version, and the first that broke."""
    if not isinstance(data, dict):
        check.fail("the top level must be an object")
    check.need(data, "first_failing", "str", nullable=True)
    check.need(data, "last_passing", "str", nullable=True)
    for prefix, row in check.items(data, "versions"):
        for key in ("version", "status", "detail"):
            check.need(row, key, "str", prefix)
    return data


def check_sanitizer(check: _Check, data) -> dict:
    """The compute-sanitizer run (harness/sanitizer/cli.py): the binary used, one result per tool and case,
    per-tool figures; or, when no binary was found, `binary: null` and the `error`."""
    if not isinstance(data, dict):
        check.fail("the top level must be an object")
    binary = check.need(data, "binary", "object", nullable=True)
    for key in ("path", "source", "version") if binary is not None else ():
        check.need(binary, key, "str", "binary.", nullable=True)
    check.need(data, "error", "str", optional=True)
    figures = check.need(data, "figures", "object", optional=True) or {}
    for tool, row in figures.items():
        if not isinstance(row, dict):
            check.fail(f"field 'figures.{tool}' must be an object, got {json.dumps(row)[:60]}")
    for prefix, result in check.items(data, "results"):
        check.need(result, "tool", "str", prefix)
        check.need(result, "case", "str", prefix)
        check.need(result, "status", "str", prefix, allowed=SANITIZER_STATUSES)
        for key in ("problem", "expected", "replay"):
            check.need(result, key, "str", prefix, optional=True)
        for key in ("exit_code", "errors", "warnings"):
            check.need(result, key, "int", prefix, optional=True)
        for key in ("seconds", "plain_seconds", "slowdown"):
            check.need(result, key, "number", prefix, optional=True)
        list(check.items(result, "kernels_seen", prefix, optional=True, kind="str"))
        for kind, name in (check.need(result, "raw", "object", prefix, optional=True) or {}).items():
            if not isinstance(name, str):
                check.fail(f"field '{prefix}raw.{kind}' must be str, got {json.dumps(name)[:60]}")
        for fprefix, finding in check.items(result, "findings", prefix, optional=True):
            for key in ("kind", "kernel", "message", "severity"):
                check.need(finding, key, "str", fprefix, optional=True)
    return data


def check_kernel(check: _Check, data) -> dict:
    """A kernel benchmark, shown generically. Rows are flat (`name`, `tokens`, `ms`, ...) or hold one object
    per implementation (`tokens`, `triton: {ms, ...}`, `torch: {...}`, as benchmarks/sparse_kernel.py
    writes); both become flat rows. The other top-level fields are facts: scalars, one level of objects,
    and lists by their length."""
    if isinstance(data, list):
        data = {"rows": data}
    if not isinstance(data, dict):
        check.fail("the top level must be a list of rows or an object with 'rows'")
    rows = []
    for prefix, row in check.items(data, "rows"):
        scalars = {k: v for k, v in row.items() if not isinstance(v, (dict, list))}
        per_impl = {k: v for k, v in row.items() if isinstance(v, dict) and "ms" in v}
        if not per_impl:
            check.need(row, "name", "str", prefix)
        check.need(row, "tokens", "int", prefix, optional=True)
        for where, flat in ([(f"{prefix}{k}.", {"name": k, **scalars, **v}) for k, v in per_impl.items()]
                            or [(prefix, scalars)]):
            for key in ("ms", "gbps", "tflops", "pct_roofline", "roofline_gbps"):
                check.need(flat, key, "number", where, optional=True)
            rows.append({k: v for k, v in flat.items() if not isinstance(v, (dict, list))})
    facts = {}
    for key, value in data.items():
        if key == "rows":
            continue
        if isinstance(value, dict):
            facts.update({f"{key}.{k}": v for k, v in value.items() if not isinstance(v, (dict, list))})
        elif isinstance(value, list):
            facts[key] = f"{len(value)} entr{'y' if len(value) == 1 else 'ies'}"
        else:
            facts[key] = value
    return {"rows": rows, "meta": facts}


def check_nightly(check: _Check, data) -> dict:
    """harness/nightly.py: each step's command, exit code, time and outcome. A step that could not run
    may have left no file of its own; this is where the page learns of it."""
    if not isinstance(data, dict):
        check.fail("the top level must be an object")
    check.need(data, "exit_code", "int")
    check.need(data, "interrupted", "str", optional=True)
    for prefix, step in check.items(data, "steps"):
        check.need(step, "name", "str", prefix)
        list(check.items(step, "command", prefix, kind="str"))
        check.need(step, "exit_code", "int", prefix, nullable=True)
        check.need(step, "seconds", "number", prefix)
        check.need(step, "outcome", "str", prefix, allowed=STEP_OUTCOMES)
    return data


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


def load_folder(path: Path, pytest_junit: Path | None = None) -> ReportFolder:
    """`pytest_junit`: where pytest wrote its JUnit XML, when not in the folder as junit-pytest.xml."""
    path = Path(path)
    if not path.is_dir():
        raise InvalidArgument(f"report folder {path}: no such directory")
    folder = ReportFolder(path)
    for name, attr, check in ((SUMMARY, "summary", check_summary), (MUTANTS, "mutants", check_mutants),
                              (CLEAN_REFERENCE, "clean_reference", check_clean_reference),
                              (TRIAGE, "triage", check_triage), (SANITIZER, "sanitizer", check_sanitizer),
                              (KERNEL, "kernel", check_kernel), (NIGHTLY, "nightly", check_nightly),
                              (VERSIONS, "versions", check_versions)):
        file = path / name
        if file.is_file():
            setattr(folder, attr, check(_Check(name), _read_json(file)))
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
