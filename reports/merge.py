"""`python -m harness merge DIR... --into DIR`: one report from the folders of shards, workers or hosts.

Each folder is read and validated as `harness report` reads it; a corrupt file, or a folder whose
campaign is another one (another target, mutant, semantics, device, profile or seed), is refused
with exit 2 naming the folder, and nothing is written. Then:

- campaigns (`summary.json`): cases add up, findings are merged by their replay command (one bug
  found by two shards is one finding), the per-case logs are joined in the order the cases finished,
  and each source's shard, GPU, cases and rate are listed under `workers`; a shard given twice is
  refused, a missing one is recorded (the page then cannot vouch for the whole stream); the fast
  path's measured overlap adds its counts, and its median is the pooled values' (a median of medians
  is no median);
- kill tables: the rows of a partition of the mutants, each mutant once; the clean reference's
  cases and findings add up;
- sanitizer runs: the results, each (tool, case) once;
- pytest's JUnit files: every `<testsuite>` in one file;
- `examples/`: every stored failure, so the merged folder replays them all with `--from-db`;
- a file the merge cannot combine (`triage.json`, `kernel.json`, `versions.json`) is taken from the
  one folder that holds it, and refused when two folders hold different ones.

The merged folder is written in one step (`reports.writers.replace_report`) and its page rendered.
"""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

from harness.coverage import merge_tables
from harness.errors import InvalidArgument
from harness.overlap import merge as merge_overlaps
from reports.cli import render_folder
from reports.folder import EXAMPLES, PYTEST_JUNIT, ReportFolder, load_folder
from reports.junit import CAMPAIGN, MUTANTS as JUNIT_MUTANTS, SANITIZER as JUNIT_SANITIZER
from reports.schema import (CLEAN_REFERENCE, KERNEL, MUTANTS, NIGHTLY, SANITIZER, SUMMARY, TRIAGE, VERSIONS,
                            ReportError)
from reports.writers import refuse_other_runs, replace_report, write_bytes_atomically, write_report

CAMPAIGN_IDENTITY = ("target", "target_description", "without", "mutant", "semantics", "device", "profile", "seed")
REPORT_FILES = (SUMMARY, MUTANTS, CLEAN_REFERENCE, TRIAGE, SANITIZER, KERNEL, NIGHTLY, VERSIONS, PYTEST_JUNIT,
                CAMPAIGN, JUNIT_MUTANTS, JUNIT_SANITIZER, "index.html", EXAMPLES)
SINGLE_FILES = ((TRIAGE, "triage"), (KERNEL, "kernel"), (VERSIONS, "versions"))


def _shard(summary: dict) -> tuple[int, int]:
    """A campaign's part of the stream; a summary from before sharding was the whole stream."""
    if "shard" not in summary:
        return 1, 1
    if summary["shard"] is None:
        raise InvalidArgument("a merge that misses shards cannot be merged again: merge the shards' own folders")
    return summary["shard"]["index"], summary["shard"]["count"]


def _gpu_name(summary: dict) -> str | None:
    for gpu in (summary.get("telemetry") or {}).get("gpus") or []:
        for source in (gpu, gpu.get("after") or {}, gpu.get("before") or {}):
            if isinstance(source, dict) and source.get("name"):
                return source["name"]
    return None


def worker_rows(label: str, summary: dict) -> list[dict]:
    """What the page lists per worker: the source's own rows (a run with --workers), or one row."""
    if summary.get("workers"):
        return [{**row, "folder": f"{label}/{row['folder']}"} for row in summary["workers"]]
    index, count = _shard(summary)
    return [{"folder": label, "shard": f"{index}/{count}", "cuda_visible_devices": summary.get("cuda_visible_devices"),
             "gpu": _gpu_name(summary), "cases": summary["cases"], "duration_s": summary["duration_s"],
             "cases_per_second": summary.get("cases_per_second")}]


def merge_summaries(sources: list[tuple[str, dict]], *, duration_s: float | None = None,
                    whole: dict | None = None) -> dict:
    """`sources`: (label, validated summary) pairs. `duration_s`: the wall time of the whole run
    when known (workers of one run); otherwise the longest source's, as shards run side by side.
    `whole`: the shard the sources make up together, when they are the workers of one run's shard
    (their own shards then cover that shard, not the whole stream)."""
    first_label, first = sources[0]
    seen: dict[tuple[int, int], str] = {}
    for label, summary in sources:
        for key in CAMPAIGN_IDENTITY:
            if summary.get(key) != first.get(key):
                raise InvalidArgument(f"{label}: its campaign has {key}={summary.get(key)!r} but {first_label}'s has "
                                      f"{first.get(key)!r}: it does not belong to this merge")
        shard = _shard(summary)
        if shard[1] != _shard(first)[1]:
            raise InvalidArgument(f"{label}: shard {shard[0]}/{shard[1]} is of another partition than {first_label}'s "
                                  f"({_shard(first)[0]}/{_shard(first)[1]})")
        if shard in seen:
            raise InvalidArgument(f"{label}: shard {shard[0]}/{shard[1]} is also in {seen[shard]}: the folders overlap")
        seen[shard] = label
    count = _shard(first)[1]
    findings: dict[str, dict] = {}
    for _, summary in sources:
        for finding in summary["findings"]:
            findings.setdefault(f"{finding['replay']}\n{finding['oracle']}/{finding['kind']}", finding)
    log = sorted((record for _, s in sources for record in s.get("cases_log") or []), key=lambda r: r["t"])
    detections = [s["first_detection"] for _, s in sources if s.get("first_detection")]
    cases = sum(s["cases"] for _, s in sources)
    duration = duration_s if duration_s is not None else max(s["duration_s"] for _, s in sources)
    merged = {key: first.get(key) for key in CAMPAIGN_IDENTITY}
    merged.update(
        cases=cases, duration_s=round(duration, 3),
        cases_per_second=round(cases / duration, 2) if duration else None,
        first_detection=min(detections, key=lambda d: d["seconds"]) if detections else None,
        findings=list(findings.values()),
        cases_log=[{**record, "i": i} for i, record in enumerate(log, 1)],
        shard=whole or ({"index": 1, "count": 1} if len(seen) == count else None),
        shards_missing=[] if whole else [k for k in range(1, count + 1) if (k, count) not in seen],
        interrupted=next((s["interrupted"] for _, s in sources if s.get("interrupted")), None),
        replayed_from_db=sum(s.get("replayed_from_db") or 0 for _, s in sources),
        stand_ins=list({row["module"]: row for _, s in sources for row in s.get("stand_ins") or []}.values()),
        workers=[row for label, s in sources for row in worker_rows(label, s)],
        oracles=first.get("oracles"),
        jobs=first.get("jobs"),  # each worker's, the same for all
    )
    coverage = [s["coverage"] for _, s in sources if s.get("coverage")]
    if coverage:
        merged["coverage"] = merge_tables(coverage)
    times = [s["time"] for _, s in sources if s.get("time")]
    if times:  # seconds summed over the sources (worker processes' time, not the run's wall time)
        merged["time"] = {phase: round(sum(t.get(phase, 0.0) for t in times), 3) for phase in dict.fromkeys(
            phase for t in times for phase in t)}
    gates = [s["race_gates"] for _, s in sources if s.get("race_gates")]
    if gates:  # how the CUDA race gates opened, counted over the sources
        merged["race_gates"] = {way: sum(g.get(way, 0) for g in gates) for way in dict.fromkeys(
            way for g in gates for way in g)}
    overlaps = [s["fast_path_overlap"] for _, s in sources if s.get("fast_path_overlap")]
    if overlaps:  # counts added, the median of the pooled values (harness/overlap.py merge)
        merged["fast_path_overlap"] = merge_overlaps(overlaps)
    telemetry = [s["telemetry"] for _, s in sources if s.get("telemetry")]
    if any(t["gpus"] for t in telemetry):
        merged["telemetry"] = {"gpus": [g for t in telemetry for g in t["gpus"]],
                               "suspect": any(t["suspect"] for t in telemetry),
                               "reasons": [r for t in telemetry for r in t["reasons"]]}
    return merged


def merge_mutants(sources: list[tuple[str, ReportFolder]]) -> tuple[list[dict] | None, dict | None]:
    rows: dict[str, tuple[str, dict]] = {}
    for label, folder in sources:
        for row in folder.mutants or []:
            if row["name"] in rows:
                raise InvalidArgument(f"{label}: mutant {row['name']} is also in {rows[row['name']][0]}: the shards "
                                      "of the kill table overlap")
            rows[row["name"]] = (label, row)
    cleans = [f.clean_reference for _, f in sources if f.clean_reference is not None]
    clean = None if not cleans else {
        "name": "(clean reference)", "cases": sum(c["cases"] for c in cleans),
        "findings": sum(c["findings"] for c in cleans),
        "finding": next((c["finding"] for c in cleans if c["finding"]), None)}
    has_table = any(f.mutants is not None for _, f in sources)
    return ([row for _, row in rows.values()] if has_table else None), clean


def merge_sanitizer(sources: list[tuple[str, ReportFolder]]) -> dict | None:
    docs = [f.sanitizer for _, f in sources if f.sanitizer is not None]
    if not docs:
        return None
    results: dict[tuple, dict] = {}
    for doc in docs:
        for result in doc["results"]:
            results.setdefault((result["tool"], result["case"], result.get("replay")), result)
    figures: dict = {}
    for doc in docs:
        for tool, row in (doc.get("figures") or {}).items():
            figures.setdefault(tool, row)
    errors = [doc["error"] for doc in docs if doc.get("error")]
    merged = {"binary": next((d["binary"] for d in docs if d["binary"]), None), "results": list(results.values()),
              "figures": figures}
    if errors:
        merged["error"] = "; ".join(errors)
    return merged


def merge_nightly(sources: list[tuple[str, ReportFolder]]) -> dict | None:
    docs = [(label, f.nightly) for label, f in sources if f.nightly is not None]
    if not docs:
        return None
    if len(docs) == 1:
        return docs[0][1]
    return {"exit_code": max(doc["exit_code"] for _, doc in docs),
            "steps": [{**step, "name": f"{step['name']} ({label})"} for label, doc in docs for step in doc["steps"]]}


def merge_pytest_junit(paths: list[Path]) -> bytes | None:
    if not paths:
        return None
    root = ET.Element("testsuites")
    for path in paths:
        tree = ET.parse(path).getroot()
        root.extend([tree] if tree.tag == "testsuite" else tree.findall("testsuite"))
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


def _single_files(sources: list[tuple[str, ReportFolder]]) -> dict[str, Path]:
    chosen: dict[str, tuple[str, Path]] = {}
    for name, attr in SINGLE_FILES:
        for label, folder in sources:
            if getattr(folder, attr) is None:
                continue
            path = folder.path / name
            if name in chosen and path.read_bytes() != chosen[name][1].read_bytes():
                raise InvalidArgument(f"{label}: its {name} differs from the one in {chosen[name][0]}; a merge can "
                                      f"take {name} from one folder only")
            chosen.setdefault(name, (label, path))
    return {name: path for name, (_, path) in chosen.items()}


def load_sources(dirs: list[Path]) -> list[tuple[str, ReportFolder]]:
    sources = []
    for path in dirs:
        try:
            folder = load_folder(path)
        except ReportError as exc:
            raise InvalidArgument(f"{path}: {exc}") from None
        if folder.empty:
            raise InvalidArgument(f"{path}: holds none of the report files (summary.json, mutants.json, "
                                  "sanitizer.json, junit-pytest.xml, ...): nothing to merge")
        sources.append((str(path), folder))
    return sources


def merge_folders(dirs: list[Path], into: Path, *, overwrite: bool = False, into_name: str = "into",
                  overwrite_name: str = "overwrite"):
    """Returns the merged folder's files, its verdict (`reports.cli.render_folder`) and its summary. `into`
    among `dirs`, or holding another run's report without `overwrite`, is refused naming them as the
    caller knows them (`into_name`, `overwrite_name`: the command's flags)."""
    into = Path(into)
    if any(Path(d).resolve() == into.resolve() for d in dirs):
        raise InvalidArgument(f"{into_name} {into}: is also one of the folders to merge")
    refuse_other_runs(into, REPORT_FILES, overwrite=overwrite, name=into_name, overwrite_name=overwrite_name)
    sources = load_sources([Path(d) for d in dirs])
    summaries = [(label, f.summary) for label, f in sources if f.summary is not None]
    summary = merge_summaries(summaries) if summaries else None
    mutants, clean = merge_mutants(sources)
    sanitizer = merge_sanitizer(sources)
    nightly = merge_nightly(sources)
    junit = merge_pytest_junit([f.path / PYTEST_JUNIT for _, f in sources if f.pytest is not None])
    singles = _single_files(sources)
    outcome = {}

    def build(staging: Path) -> None:
        for name, data in ((SUMMARY, summary), (MUTANTS, mutants), (CLEAN_REFERENCE, clean), (SANITIZER, sanitizer),
                           (NIGHTLY, nightly)):
            if data is not None:
                write_report(staging / name, data)
        if junit is not None:
            write_bytes_atomically(staging / PYTEST_JUNIT, junit)
        for name, path in singles.items():
            shutil.copy2(path, staging / name)
        for _, folder in sources:
            if (folder.path / EXAMPLES).is_dir():
                shutil.copytree(folder.path / EXAMPLES, staging / EXAMPLES, dirs_exist_ok=True)
        outcome["rendered"] = render_folder(staging, shown_as=into)

    replace_report(into, REPORT_FILES, build)
    _, verdict = outcome["rendered"]
    return sorted(into.iterdir()), verdict, summary
