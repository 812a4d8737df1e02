"""index.html: the page a person reads first, self-contained (inline CSS and SVG, no network).

The verdict comes first, then the findings with their minimal case, first differing values and
replay command, then each run's section. A part whose file is absent is left out.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import jinja2

from harness.overlap import describe as describe_overlap
from reports import plots
from reports.folder import SANITIZER_RAW_DIR, ReportFolder, time_rows
from reports.junit import flatten
from reports.verdict import sanitizer_outcome, verdict_of
from reports.writers import write_text_atomically

INDEX = "index.html"
TEMPLATES = Path(__file__).parent / "templates"

def first_difference(finding: dict) -> list[tuple[str, str]]:
    """The first differing values a finding's details name, as (label, value) rows; [] when they name none.
    Only the structured details are read (`harness/findings.py` lists them): the message is for people,
    and rewording it changes nothing here."""
    details = finding.get("details") or {}
    if "overlapped" in details and "barriered" in details:  # a differing output
        return ([("output", str(details["tensor"]))] + _row(details) + [("index", str(details["index"]))]
                + [("overlapped run", str(details["overlapped"])), ("barriered run", str(details["barriered"]))])
    if "max_error" in details:  # a float64 mismatch
        return ([("layer", f"{details['layer']} (ratio {details['ratio']})")] + _row(details)
                + [("max error", str(details["max_error"])), ("tolerance", str(details["tolerance"]))])
    return []


def _row(details: dict) -> list[tuple[str, str]]:
    """The request and token row a difference is in, where the details name them."""
    rows = []
    if "request" in details:
        pool = f" (pool row {details['pool_row']})" if "pool_row" in details else ""
        rows.append(("request", f"{details['request']}{pool}"))
    if "token_row" in details:
        rows.append(("token row", f"{details['token_row']} at position {details['position']}"))
    return rows


def group_findings(findings: list[dict]) -> list[dict]:
    """Findings of one minimal case share its summary and replay command: show those once."""
    groups: dict[tuple[str, str], dict] = {}
    for finding in findings:
        key = (finding["case_summary"], finding["replay"])
        group = groups.setdefault(key, {"case_summary": key[0], "replay": key[1], "findings": []})
        group["findings"].append({**finding, "first_difference": first_difference(finding)})
    for group in groups.values():  # performance-only findings (a missed fast path) are drawn apart
        group["performance"] = all(f.get("severity") == "performance" for f in group["findings"])
    return list(groups.values())


def _fmt(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return ", ".join(_fmt(v) for v in value)
    return str(value)


def _gpu_title(gpu: dict, index: int) -> str:
    for source in (gpu, gpu.get("after") or {}, gpu.get("before") or {}):
        if isinstance(source, dict) and source.get("name"):
            return f"GPU {source.get('index', index)}: {source['name']}"
    return f"GPU {index}"


def _overlap_context(tally: dict | None, with_plots: bool) -> dict | None:
    """The fast path's measured overlap (summary.json's `fast_path_overlap`): its line, a row per group of batches
    and the histogram; None for a summary written before it was measured."""
    if tally is None:
        return None
    rows = [] if "unmeasured" in tally else [("published read-done", tally["publishing"]),
                                               ("did not publish", tally["not_publishing"])]
    return {"line": describe_overlap(tally), "rows": rows,
            "plot": plots.fast_path_overlap(tally) if with_plots else None}


def _campaign_context(summary: dict, with_plots: bool = True) -> dict:
    log = (summary.get("cases_log") or []) if with_plots else []
    telemetry = summary.get("telemetry")
    return {
        "summary": summary,
        "time": time_rows(summary.get("time") or {}),
        "overlap": _overlap_context(summary.get("fast_path_overlap"), with_plots),
        "groups": group_findings(summary["findings"]),
        "plots": [p for p in (plots.cases_over_time(log), plots.geometry(log)) if p],
        "telemetry": None if telemetry is None else {
            "suspect": telemetry["suspect"], "reasons": telemetry["reasons"], "unavailable": telemetry["unavailable"],
            "gpus": [{"title": _gpu_title(g, i), "rows": [(name[1:], value) for name, value in flatten("", g)]}
                     for i, g in enumerate(telemetry["gpus"])]},
    }


def render_html(folder: ReportFolder) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["fmt"] = _fmt
    env.filters["shquote"] = lambda path: shlex.quote(str(path))
    kernel = folder.kernel
    columns = list(dict.fromkeys(k for row in kernel["rows"] for k in row)) if kernel else []
    sanitizer = folder.sanitizer
    return env.get_template("index.html.j2").render(
        folder=folder,
        verdict=verdict_of(folder),
        campaign=_campaign_context(folder.summary) if folder.summary else None,
        triage=folder.triage and {**folder.triage, "context": folder.triage["campaign"] and
                                  _campaign_context(folder.triage["campaign"], False)},
        versions=folder.versions,
        mutants=folder.mutants,
        clean_reference=folder.clean_reference,
        mutants_plot=plots.detection_times(folder.mutants) if folder.mutants else None,
        sanitizer=sanitizer and {
            "binary": sanitizer["binary"], "error": sanitizer.get("error"), "raw_dir": SANITIZER_RAW_DIR, "figures": sanitizer.get("figures") or {},
            "figure_columns": list(dict.fromkeys(k for row in (sanitizer.get("figures") or {}).values() for k in row)),
            "tools": {tool: [{**r, "outcome": sanitizer_outcome(r)} for r in sanitizer["results"] if r["tool"] == tool]
                      for tool in dict.fromkeys(r["tool"] for r in sanitizer["results"])},
            "plot": plots.sanitizer_slowdown(sanitizer["results"])},
        kernel=kernel and {"rows": kernel["rows"], "meta": kernel["meta"], "columns": columns,
                           "plot": plots.kernel_vs_roofline(kernel["rows"])},
        pytest=folder.pytest,
        nightly=folder.nightly,
        replay_db=_replay_db_command(folder),
    )


def _replay_db_command(folder: ReportFolder) -> str | None:
    """The one command that replays every failure stored in the folder's example database."""
    s = folder.summary
    if folder.examples is None or s is None or not s.get("profile"):
        return None
    return (f"python -m harness run --target {s['target']} --device {s['device']} --semantics {s['semantics']} "
            f"--profile {s['profile']}{' --mutant ' + s['mutant'] if s.get('mutant') else ''} "
            f"--report-dir {shlex.quote(str(folder.display_path))} --from-db")


def write_index(folder: ReportFolder) -> Path:
    path = folder.path / INDEX
    write_text_atomically(path, render_html(folder))
    return path
