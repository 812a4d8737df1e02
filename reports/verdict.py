"""The one word at the top of the report: FOUND, BROKEN, INTERRUPTED or CLEAN, and why.

FOUND: something in the target was found (a campaign finding, a contract break, a sanitizer finding
on a clean kernel, a failed test). BROKEN: the run cannot vouch for its own result (a mutant
survived, a planted sanitizer bug went unseen, a tool failed, nothing ran, the GPU was suspect).
INTERRUPTED: a signal stopped a run that had found nothing and was otherwise sound: the report holds
the cases before it, and `run` exits 4 for it, as `report` and `merge` do for the page (it was once
4 from `run`, 3 from `report`, and BROKEN on the page beside a green "clean"). CLEAN only when every
part that is present ran to its end and found nothing. FOUND wins over BROKEN because it is news
about the target, BROKEN over INTERRUPTED because a cut-short run is still sound in what it did;
every reason of each kind is listed under the headline.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reports.folder import ReportFolder

FOUND, BROKEN, INTERRUPTED, CLEAN = "FOUND", "BROKEN", "INTERRUPTED", "CLEAN"
OK = "ok"  # a part that ran as it should


@dataclass
class Verdict:
    status: str
    reason: str
    found: list[str] = field(default_factory=list)
    broken: list[str] = field(default_factory=list)
    interrupted: list[str] = field(default_factory=list)


def _first_line(text: str, width: int = 160) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= width else line[: width - 1] + "…"


def sanitizer_outcome(result: dict) -> tuple[str, str]:
    """(FOUND | BROKEN | OK, why) for one tool on one case; `expected` is "clean" or a planted finding kind."""
    expected = result.get("expected") or "clean"
    kinds = [f.get("kind") for f in result.get("findings") or []]
    where = f"{result['tool']} on {result['case']}"
    if result["status"] == "failed":
        return BROKEN, f"{where} failed: {result.get('problem') or 'no reason given'}"
    if expected == "clean":
        if result["status"] == "found":
            first = (result.get("findings") or [{}])[0]
            return FOUND, f"{where}: {len(kinds)} finding(s), first {first.get('kind', '?')} in {first.get('kernel', '?')}"
        return OK, f"{where}: clean"
    if result["status"] != "found":
        return BROKEN, f"{where}: the planted {expected} was not found"
    if expected not in kinds:  # detected, as the sanitizer command counts it, but under another name
        return OK, f"{where}: found the planted bug, reported as {', '.join(map(str, kinds)) or 'no parsed finding'}"
    return OK, f"{where}: found the planted {expected}"


def campaign_reasons(summary: dict, label: str) -> tuple[list[str], list[str], list[str]]:
    """(found, broken, interrupted) reasons of one campaign summary."""
    found, broken, interrupted = [], [], []
    if summary["cases"] == 0:
        broken.append(f"{label} ran no cases")
    findings = summary["findings"]
    if findings:
        first = findings[0]
        found.append(f"{label}: {len(findings)} finding(s) in {summary['cases']} cases; first "
                     f"{first['oracle']}/{first['kind']}: {_first_line(first['message'], 120)}")
    if summary.get("interrupted"):
        interrupted.append(f"{label} was interrupted by {summary['interrupted']} after {summary['cases']} cases: "
                           "the report holds them")
    if summary.get("shards_missing"):
        broken.append(f"{label}: shard(s) {', '.join(map(str, summary['shards_missing']))} missing from the merge: "
                      "the campaign is incomplete")
    telemetry = summary.get("telemetry")
    if telemetry and telemetry["suspect"]:
        broken.append(f"{label}: the GPU was suspect ({'; '.join(telemetry['reasons']) or 'no reason given'})")
    return found, broken, interrupted


def verdict_of(folder: ReportFolder) -> Verdict:
    found, broken, interrupted, ran = [], [], [], []
    if folder.empty:
        broken.append("the report folder holds none of the report files: nothing ran, or nothing was written")
    if folder.summary is not None:
        f, b, i = campaign_reasons(folder.summary, "campaign")
        found += f
        broken += b
        interrupted += i
        ran.append(f"{folder.summary['cases']} campaign cases")
    if folder.triage is not None:
        for kind in ("contract", "static"):
            breaks = folder.triage[f"{kind}_breaks"]
            if breaks:
                first = breaks[0]
                found.append(f"triage: {len(breaks)} {kind} break(s); first {first['cls']}.{first['attribute']} "
                             f"missing ({first['file']}:{first['line']})")
        if folder.triage["campaign"] is not None:
            f, b, i = campaign_reasons(folder.triage["campaign"], "triage campaign")
            found += f
            broken += b
            interrupted += i
        ran.append("triage")
    if folder.versions is not None:
        if folder.versions["first_failing"]:
            found.append(f"versions: the first failing version is {folder.versions['first_failing']} "
                         f"(last passing: {folder.versions['last_passing'] or 'none'})")
        ran.append(f"{len(folder.versions['versions'])} versions")
    clean = folder.clean_reference
    if clean is not None and clean["findings"]:
        found.append(f"kill table: the clean reference had {clean['findings']} finding(s) in {clean['cases']} cases: "
                     f"{clean['finding']}")
    if folder.mutants is not None:
        alive = [r["name"] for r in folder.mutants if not r["killed"]]
        if not folder.mutants:
            broken.append("the kill table has no rows")
        elif alive:
            broken.append(f"kill table: {len(alive)} of {len(folder.mutants)} mutants survived ({', '.join(alive)})")
        ran.append(f"{len(folder.mutants) - len(alive)}/{len(folder.mutants)} mutants killed")
    if folder.sanitizer is not None:
        results = folder.sanitizer["results"]
        if folder.sanitizer.get("error"):
            broken.append(f"sanitizer: {folder.sanitizer['error']}")
        elif not results:
            broken.append("the sanitizer run has no results")
        for result in results:
            state, why = sanitizer_outcome(result)
            if state == FOUND:
                found.append(f"sanitizer: {why}")
            elif state == BROKEN:
                broken.append(f"sanitizer: {why}")
        ran.append(f"{len(results)} sanitizer runs")
    if folder.pytest is not None:
        run = folder.pytest
        if run.tests == 0:
            broken.append("pytest ran no tests")
        if run.errors:
            broken.append(f"pytest: {run.errors} test(s) errored, first {_first_problem(run, 'error')}")
        if run.failures:
            found.append(f"pytest: {run.failures} of {run.tests} test(s) failed, first {_first_problem(run, 'failed')}")
        ran.append(f"{run.tests} tests")
    if folder.nightly is not None:  # after the files' own reasons: those say more than an exit code
        for step in folder.nightly["steps"]:
            where = f"nightly step {step['name']} exited {step['exit_code']}"
            if step["outcome"] == "found":
                found.append(f"{where}: found something")
            elif step["outcome"] == "broken":
                broken.append(f"{where}: could not run or could not vouch")
            elif step["outcome"] == "interrupted":
                interrupted.append(f"nightly step {step['name']} was interrupted"
                              f"{' by ' + folder.nightly['interrupted'] if folder.nightly.get('interrupted') else ''}")
        ran.append(f"{len(folder.nightly['steps'])} nightly steps")
    for status, reasons in ((FOUND, found), (BROKEN, broken), (INTERRUPTED, interrupted)):
        if reasons:
            return Verdict(status, _headline(reasons), found, broken, interrupted)
    return Verdict(CLEAN, "nothing found in " + ", ".join(ran), found, broken, interrupted)


def _first_problem(run, status: str) -> str:
    case = next((c for c in run.cases if c.status == status), None)
    return case.name if case else "(not listed)"


def _headline(reasons: list[str]) -> str:
    """One line: the first reason, cut short (the page lists them all in full)."""
    return _first_line(reasons[0], 150) + (f" (and {len(reasons) - 1} more)" if len(reasons) > 1 else "")
