"""compute-sanitizer's outputs, read into typed findings: the XML records (`--xml --save`) and the
text summary line, which is parsed too, as a cross-check of the XML.

The XML is the source of the findings; it holds at most `--print-limit` records, while the summary
line counts every error. So the XML gives what went wrong and where, the summary how often, and the
two must agree on what was displayed. Anything unreadable raises `OutputError`, never a quiet zero.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from pathlib import PurePath

# racecheck: "RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)"; the other tools:
# "ERROR SUMMARY: 2 errors". Anchored at the line end, so "ERROR SUMMARY: 156 errors were not
# printed. Use --print-limit ..." is not read as a count.
_RACE_SUMMARY = re.compile(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)\s*$",
                           re.MULTILINE)
_ERROR_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) errors?\s*$", re.MULTILINE)


class OutputError(Exception):
    """The sanitizer's output is missing or unreadable; `code` names which, for the result's problem."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Finding:
    kind: str  # race, out-of-bounds, misaligned, memory-access, uninitialized-read, unused-memory, barrier,
    #            api-error, leak, or other:<record kind> for a record this parser does not know
    kernel: str | None
    location: str | None  # file:line of the faulting instruction, when the code has line info
    thread: str | None  # "(x,y,z)"; racecheck: both threads of the hazard
    block: str | None
    address: str | None
    access: str | None  # direction, space and size; racecheck: the hazard type and both accesses
    severity: str  # error | warning
    message: str

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Summary:
    """The text summary: errors counted by the tool; racecheck also says how many hazards it displayed."""

    errors: int
    warnings: int | None = None
    displayed: int | None = None


def parse_summary(text: str) -> Summary:
    """One summary per tracked process; they add up."""
    races = _RACE_SUMMARY.findall(text)
    if races:
        return Summary(errors=sum(int(r[1]) for r in races), warnings=sum(int(r[2]) for r in races),
                       displayed=sum(int(r[0]) for r in races))
    counts = _ERROR_SUMMARY.findall(text)
    if not counts:
        raise OutputError("no-summary", "the sanitizer's log has no summary line (no 'ERROR SUMMARY: N errors' "
                                        "or 'RACECHECK SUMMARY: ...'): the tool did not finish")
    return Summary(errors=sum(int(c) for c in counts))


def _text(node: ET.Element | None, path: str) -> str | None:
    found = None if node is None else node.find(path)
    return found.text.strip() if found is not None and found.text else None


def _dim3(node: ET.Element | None) -> str | None:
    if node is None:
        return None
    return "(" + ",".join(_text(node, axis) or "0" for axis in ("x", "y", "z")) + ")"


def _location(where: ET.Element | None) -> str | None:
    path, line = _text(where, "path"), _text(where, "line")
    if not path:
        return None
    return f"{PurePath(path).name}:{line}" if line else PurePath(path).name


def _memory_kind(error: str | None) -> str:
    error = (error or "").lower()
    if "out of bounds" in error:
        return "out-of-bounds"
    if "misaligned" in error:
        return "misaligned"
    return "memory-access"


def _memcheck(record: ET.Element, severity: str) -> Finding:
    what, where, who = record.find("what"), record.find("where"), record.find("who")
    access = " ".join(p for p in (_text(what, "direction"), _text(what, "space"),
                                  f"{_text(what, 'size')} bytes" if _text(what, "size") else None) if p)
    return Finding(_memory_kind(_text(what, "error")), _text(where, "func"), _location(where),
                   _dim3(who.find("threadIdx") if who is not None else None),
                   _dim3(who.find("blockIdx") if who is not None else None),
                   _text(what, "address"), access or None, severity, _text(what, "text") or "")


def _hazard(record: ET.Element, severity: str) -> Finding:
    what = record.find("what")
    common = what.find("common") if what is not None else None
    sides = [what.find(side) if what is not None else None for side in ("thread0", "thread1")]
    threads = " / ".join(f"{_text(s, 'access')} {_dim3(s.find('threadIdx'))}" for s in sides if s is not None)
    accesses = " -> ".join(f"{_text(s, 'access')} at {_location(s.find('where'))}" for s in sides if s is not None)
    first = sides[0].find("where") if sides[0] is not None else None
    address = _text(common, "address")
    return Finding("race", _text(first, "func"), _location(first), threads or None,
                   _dim3(common.find("blockIdx") if common is not None else None),
                   f"__shared__ {address}" if address else None,
                   f"{_text(common, 'type')}: {accesses}", severity, _text(what, "text") or "")


def _analysis(record: ET.Element, severity: str) -> Finding:
    what = record.find("what")
    source, dest = (what.find(side) if what is not None else None for side in ("source", "destination"))
    accesses = " -> ".join(f"{_text(s, 'direction')} at {_location(s.find('where'))}" for s in (source, dest)
                           if s is not None)
    count = _text(dest, "count")
    where = source.find("where") if source is not None else None
    message = f"{_text(what, 'text') or 'Race'}" + (f" ({count} hazards)" if count else "")
    return Finding("race", _text(where, "func"), _location(where), None, None, None, accesses or None, severity,
                   message)


def _thread_record(kind: str):
    def read(record: ET.Element, severity: str) -> Finding:
        what, where, who = record.find("what"), record.find("where"), record.find("who")
        message = ": ".join(p for p in (_text(what, "text"), _text(what, "type")) if p)
        size = _text(what, "size")
        return Finding(kind(message) if callable(kind) else kind, _text(where, "func"), _location(where),
                       _dim3(who.find("threadIdx") if who is not None else None),
                       _dim3(who.find("blockIdx") if who is not None else None),
                       _text(what, "address"), f"read {size} bytes" if size else None, severity, message)

    return read


def _api(record: ET.Element, severity: str) -> Finding:
    what = record.find("what")
    return Finding("api-error", None, None, None, None, None, _text(what, "api"), severity, _text(what, "text") or "")


def _initcheck_kind(message: str) -> str:
    return "unused-memory" if "unused" in message.lower() else "uninitialized-read"


_READERS = {"precise": _memcheck, "imprecise": _memcheck, "hazard": _hazard, "analysis": _analysis,
            "initcheck": _thread_record(_initcheck_kind), "synccheck": _thread_record("barrier"), "api": _api}


def _other(record: ET.Element, severity: str) -> Finding:
    kind = (_text(record, "kind") or "unknown").lower()
    what, where = record.find("what"), record.find("where")
    leak = "leak" in kind
    return Finding("leak" if leak else f"other:{kind}", _text(where, "func"), _location(where), None, None,
                   _text(what, "address"), None, severity,
                   _text(what, "text") or ET.tostring(record, encoding="unicode")[:300])


def parse_xml(text: str) -> list[Finding]:
    """Every `<record>` of a `--xml --save` file as a Finding; an unknown record kind is kept, never dropped."""
    if not text.strip():
        raise OutputError("malformed-xml", "the XML file is empty")
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise OutputError("malformed-xml", f"the XML does not parse ({exc}): truncated or corrupt") from exc
    if root.tag != "ComputeSanitizerOutput":
        raise OutputError("malformed-xml", f"the XML root is <{root.tag}>, not <ComputeSanitizerOutput>")
    findings = []
    for record in root.iter("record"):
        severity = (_text(record, "level") or "error").lower()
        kind = (_text(record, "kind") or "").lower()
        findings.append(_READERS.get(kind, _other)(record, severity))
    return findings
