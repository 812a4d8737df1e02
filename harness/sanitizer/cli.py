"""`python -m harness sanitize`: a target's kernels and the planted bugs under compute-sanitizer, one tool at a time.

`--target reference` (the default) runs the harness's own sparse-attention kernel and metadata path;
`--target sglang` runs SGLang's own DSV4 prefill kernels and a whole case through the real SGLang path,
with bugs planted in a copy of SGLang's kernel file (`sglang_cases.py`). Both end with the tools'
positive controls (`planted.py`).

Exit 0 when every clean case is clean and every planted bug was found; 1 (found) when a clean case has
a finding; otherwise 3 (broken) when a planted bug was missed or a run proved nothing (timeout, missing
output, a kernel that never ran), or compute-sanitizer is not installed: the page's verdict, from the
same rule (`reports.verdict.sanitizer_outcome`). Writes DIR/sanitizer.json and keeps the
sanitizer's own XML and logs under DIR/sanitizer/.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from harness.errors import EnvironmentBroken, ExitCode, InvalidArgument
from harness.sanitizer.binary import find_sanitizer
from harness.sanitizer.cases import TOOLS, SanitizerCase, cases_of, get_case
from harness.sanitizer.runner import run_all
from harness.sanitizer.sglang_cases import kernel_module
from reports.folder import SANITIZER_RAW_DIR as RAW_DIR
from reports.schema import SANITIZER as REPORT_NAME
from reports.verdict import BROKEN, FOUND, sanitizer_outcome
from reports.writers import write_report


def select(tool: str, target: str, case_names: list[str], *, tool_name: str = "tool",
           target_name: str = "target") -> tuple[list[str], list[SanitizerCase]]:
    """The tools to run (`tool`: one, or all) and the cases: those named, or none named, the target's cases
    that run under those tools. A named case of another target, or under none of the tools, is refused
    before any run, naming `tool` and `target` as the caller knows them (`tool_name`, `target_name`: the
    command's flags), so that this module never names a flag."""
    tools = list(TOOLS) if tool == "all" else [tool]
    if not case_names:  # the target's cases that run under the tools asked for
        return tools, [case for case in cases_of(target) if set(case.tools) & set(tools)]
    cases = [get_case(name) for name in case_names]
    for case in cases:
        if case.target not in (target, "any"):
            raise InvalidArgument(f"case {case.name!r} runs {case.target}'s code: give {target_name}={case.target}")
        if not set(case.tools) & set(tools):
            raise InvalidArgument(f"case {case.name!r} runs under {', '.join(case.tools)} only, not {tool_name}={tool}")
    return tools, cases


def figures(results) -> dict:
    """Per tool: how many runs, how each came out, and its slowdown over the plain run of the same cases."""
    out = {}
    for tool in dict.fromkeys(r.tool for r in results):
        runs = [r for r in results if r.tool == tool]
        slow = [r.slowdown for r in runs if r.slowdown]
        body = [r.body_seconds / r.plain_body_seconds for r in runs if r.body_seconds and r.plain_body_seconds]
        out[tool] = {"runs": len(runs), "ok": sum(r.ok for r in runs),
                     "clean": sum(r.status == "clean" for r in runs), "found": sum(r.status == "found" for r in runs),
                     "failed": sum(r.status == "failed" for r in runs),
                     "errors_in_clean_cases": sum(r.errors for r in runs if r.expected == "clean"),
                     "planted_found": sum(r.ok for r in runs if r.expected != "clean"),
                     "median_slowdown": round(statistics.median(slow), 2) if slow else None,
                     "max_slowdown": round(max(slow), 2) if slow else None,
                     "median_body_slowdown": round(statistics.median(body), 2) if body else None}
    return out


def _line(r) -> str:
    verdict = "ok" if r.ok else "FAIL"
    what = r.status if r.status != "found" else f"found {r.errors} error(s)"
    timing = f"{r.seconds:.1f}s" + (f" (x{r.slowdown} plain)" if r.slowdown else "")
    text = f"[{verdict}] {r.tool:9} {r.case:22} {what} (expected {r.expected}) {timing}"
    if r.problem:
        text += f"\n    {r.problem}"
    if not r.ok:
        text += f"\n    replay: {r.replay}"
    return text


def sanitize(tools: list[str], cases: list[SanitizerCase], *, target: str, report_dir: Path, timeout: float,
             jobs: int) -> int:
    """`cases` under each of `tools` (`select`), into `report_dir`; the exit code is the page's verdict."""
    if target == "sglang":
        kernel_module()  # sglang missing: exit 3 before any run, not a never-ran per case
    try:
        binary = find_sanitizer()
    except EnvironmentBroken as exc:
        write_report(report_dir / REPORT_NAME, {"binary": None, "error": str(exc), "ok": False, "results": []})
        raise
    print(f"compute-sanitizer {binary.version} ({binary.source}: {binary.path}); tools: {', '.join(tools)}; "
          f"{len(cases)} case(s)", flush=True)
    results = run_all(binary, tools, cases, report_dir / RAW_DIR, timeout=timeout, jobs=jobs,
                      on_result=lambda r: print(_line(r), flush=True))
    ok = all(r.ok for r in results)
    table = figures(results)
    write_report(report_dir / REPORT_NAME, {
        "binary": binary.as_dict(), "target": target, "tools": tools, "cases": [c.name for c in cases],
        "jobs": jobs,
        "ok": ok, "figures": table, "results": [r.as_dict() for r in results]})
    for tool, row in table.items():
        print(f"{tool:9} {row['ok']}/{row['runs']} ok; errors in clean cases {row['errors_in_clean_cases']}; "
              f"planted found {row['planted_found']}; median slowdown x{row['median_slowdown']} "
              f"(max x{row['max_slowdown']}, kernel body x{row['median_body_slowdown']})")
    print(f"{'all ok' if ok else 'FAILED'}: {report_dir / REPORT_NAME}")
    outcomes = {sanitizer_outcome(r.as_dict())[0] for r in results}
    return ExitCode.FOUND if FOUND in outcomes else ExitCode.BROKEN if BROKEN in outcomes else ExitCode.OK
