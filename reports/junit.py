"""JUnit XML for the campaign, the kill table and the sanitizer run, so CI dashboards show them.

One <testsuite> per run: a testcase per case, per mutant, per tool and case. Properties carry the
replay command and, when present, the GPU telemetry; testcase-level properties follow the xunit1
family, as pytest's own `--junitxml` does with `junit_family=xunit1`.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from reports.verdict import BROKEN, FOUND, sanitizer_outcome
from reports.writers import write_bytes_atomically

CAMPAIGN, MUTANTS, SANITIZER = "junit-campaign.xml", "junit-mutants.xml", "junit-sanitizer.xml"


def _text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _properties(parent: ET.Element, pairs) -> None:
    pairs = [(name, value) for name, value in pairs if value is not None]
    if pairs:
        node = ET.SubElement(parent, "properties")
        for name, value in pairs:
            ET.SubElement(node, "property", name=name, value=_text(value))


def flatten(prefix: str, value) -> list[tuple[str, object]]:
    """Nested objects and lists as dotted (name, scalar) pairs: `telemetry.gpus.0.after.sm_clock_mhz`."""
    if isinstance(value, dict):
        return [pair for key, item in value.items() for pair in flatten(f"{prefix}.{key}", item)]
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        return [pair for i, item in enumerate(value) for pair in flatten(f"{prefix}.{i}", item)]
    return [(prefix, value)]


def telemetry_properties(summary: dict) -> list[tuple[str, object]]:
    telemetry = summary.get("telemetry")
    if telemetry is None:
        return []
    return [("telemetry.unavailable", telemetry["unavailable"]), ("telemetry.suspect", telemetry["suspect"]),
            ("telemetry.reasons", "; ".join(telemetry["reasons"]))] + [
        pair for i, gpu in enumerate(telemetry["gpus"]) for pair in flatten(f"telemetry.gpus.{i}", gpu)]


def _suite(name: str, properties) -> ET.Element:
    suite = ET.Element("testsuite", name=name)
    _properties(suite, properties)
    return suite


def _case(suite: ET.Element, classname: str, name: str, seconds: float = 0.0, properties=()) -> ET.Element:
    case = ET.SubElement(suite, "testcase", classname=classname, name=name, time=f"{seconds or 0:.3f}")
    _properties(case, properties)
    return case


def _fail(case: ET.Element, tag: str, message: str, text: str = "", kind: str = "") -> None:
    node = ET.SubElement(case, tag, message=message.strip().splitlines()[0] if message.strip() else tag)
    if kind:
        node.set("type", kind)
    node.text = text or message


def _count(suite: ET.Element) -> ET.Element:
    cases = suite.findall("testcase")
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(sum(c.find("failure") is not None for c in cases)))
    suite.set("errors", str(sum(c.find("error") is not None for c in cases)))
    suite.set("skipped", "0")
    suite.set("time", f"{sum(float(c.get('time')) for c in cases):.3f}")
    return suite


def campaign_suite(summary: dict, name: str = "campaign") -> ET.Element:
    """A testcase per logged case; the case that found something carries the shrunk case's findings."""
    suite = _suite(name, [(k, summary.get(k)) for k in ("target", "device", "semantics", "seed", "profile",
                                                         "mutant", "cases", "cases_per_second")]
                   + telemetry_properties(summary))
    classname = f"{name}.{summary['target']}" + (f"+{summary['mutant']}" if summary.get("mutant") else "")
    findings = summary["findings"]
    log = summary.get("cases_log") or []
    failing = None
    previous = 0.0
    for record in log:
        label = (f"case {record['i']}: {record['spec']}, {record['requests']} request(s), {record['tokens']} token(s), "
                 f"{'graph' if record['graph'] else 'eager'}")
        case = _case(suite, classname, label, record["t"] - previous)
        previous = record["t"]
        if record["outcome"] == "found":
            failing = case
    if summary["cases"] == 0:
        _fail(_case(suite, classname, "campaign"), "error", "the campaign ran no cases")
    elif not log:
        case = _case(suite, classname, f"campaign ({summary['cases']} cases)", summary["duration_s"])
        failing = case if findings else None
    if findings:
        if failing is None:
            failing = _case(suite, classname, "minimal case")
        first = findings[0]
        _properties(failing, [("replay", first["replay"]), ("minimal_case", first["case_summary"])])
        text = "\n\n".join(f"[{f['oracle']}/{f['kind']}] {f['message']}" for f in findings)
        _fail(failing, "failure", f"{first['oracle']}/{first['kind']}: {first['message']}",
              f"{text}\n\nminimal case: {first['case_summary']}\nreplay: {first['replay']}",
              f"{first['oracle']}/{first['kind']}")
    return _count(suite)


def mutants_suite(rows: list[dict], clean: dict | None = None) -> ET.Element:
    """A testcase per mutant: killed passes, a survivor fails; the clean reference fails on any finding."""
    suite = _suite("mutants", [])
    if clean is not None:
        case = _case(suite, "mutants", "(clean reference)", 0.0, [("cases", clean["cases"])])
        if clean["findings"]:
            _fail(case, "failure", f"the clean reference had {clean['findings']} finding(s): {clean['finding']}")
    for row in rows:
        case = _case(suite, "mutants", row["name"], row["seconds_to_detect"] or 0.0, [
            ("oracles", ",".join(row["oracles"])), ("expected_oracle", row.get("expected_oracle")),
            ("examples_to_detect", row["examples_to_detect"]), ("seconds_to_detect", row["seconds_to_detect"]),
            ("minimal_case", row.get("minimal_case")), ("replay", row.get("replay"))])
        if not row["killed"]:
            _fail(case, "failure", f"mutant survived: {row.get('description') or row['name']}")
    return _count(suite)


def sanitizer_suite(doc: dict) -> ET.Element:
    """A testcase per tool and case: a tool that failed is an error, a wrong outcome a failure."""
    binary = doc["binary"] or {}
    suite = _suite("sanitizer", [(f"binary.{k}", binary.get(k)) for k in ("path", "source", "version")])
    if doc.get("error") or not doc["results"]:
        _fail(_case(suite, "sanitizer", "compute-sanitizer"), "error", doc.get("error") or "the run has no results")
    for result in doc["results"]:
        case = _case(suite, f"sanitizer.{result['tool']}", result["case"], result.get("seconds") or 0.0, [
            (k, result.get(k)) for k in ("status", "expected", "exit_code", "errors", "warnings", "slowdown", "replay")]
            + [("kernels_seen", ",".join(result.get("kernels_seen") or []))])
        state, why = sanitizer_outcome(result)
        details = "\n".join(f"[{f.get('kind', '?')}] {f.get('kernel', '?')} {f.get('location', '')}: "
                            f"{f.get('message', '')}" for f in result.get("findings") or [])
        if state == BROKEN:
            _fail(case, "error" if result["status"] == "failed" else "failure", why, f"{why}\n{details}".strip())
        elif state == FOUND:
            _fail(case, "failure", why, f"{why}\n{details}".strip())
    return _count(suite)


def to_bytes(suite: ET.Element) -> bytes:
    root = ET.Element("testsuites")
    root.append(suite)
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


def write(path: Path, suite: ET.Element) -> Path:
    write_bytes_atomically(path, to_bytes(suite))
    return path
