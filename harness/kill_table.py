"""The kill table: the clean reference and every mutant of `harness.mutants`, each through the same campaign.

It runs campaigns, so it stands above `campaign.py`, beside the commands (`harness.commands.mutants` is its
subcommand), while the mutants it judges are targets below the engine (DESIGN.md, "Layers")."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness.campaign import run_campaign
from harness.device import DeviceKind
from harness.errors import EnvironmentBroken, ExitCode, InvalidArgument
from harness.mutants.contract_probes import run_probes
from harness.mutants.corpus import MUTANTS, mutant_target
from harness.sharding import WHOLE, Shard
from harness.targets import ReferenceTarget, TargetSpec
from harness.workers import cpu_cores
from reports import junit
from reports.cli import render_folder
from reports.schema import CLEAN_REFERENCE, MUTANTS as TABLE
from reports.writers import replace_report, write_report

CUDA_CAMPAIGN_TIMEOUT_S = 300
CUDA_JOBS_PER_CAMPAIGN = 4  # each CUDA campaign's children; as many campaigns at once as the cores hold


def kill_table(*, device: str = "cpu", examples: int = 200, semantics: str = "0.5.23", only=None,
               progress=lambda line: None, shard: Shard = WHOLE, seeds: bool = True,
               seed: int | None = None) -> tuple[dict | None, list[dict]]:
    """The clean reference's row (None outside shard 1: it runs once per table) and the mutants' rows,
    those of `shard`'s part of the mutant list. `seeds` False: every campaign draws all its cases, so
    the table measures the fuzzer, not the hand-written seed cases. `seed`: every campaign's hypothesis
    seed (None: the `ci` profile's fixed stream)."""
    names = list(MUTANTS)
    if only:
        names = [n.strip() for n in only.split(",") if n.strip()]
        unknown = [n for n in names if n not in MUTANTS]
        if unknown:
            raise InvalidArgument(f"only: unknown mutant(s) {', '.join(unknown)}; allowed: {', '.join(MUTANTS)}")
    names = shard.select(names)
    with_clean = shard.index == 1
    if DeviceKind(device).isolates_runs:
        return _kill_table_isolated(names, examples=examples, semantics=semantics, progress=progress,
                                    with_clean=with_clean, seeds=seeds, seed=seed)
    rows = []
    clean_row = _clean_row(device, examples, semantics, progress, seeds, seed) if with_clean else None
    for name in names:
        rows.append(judge_mutant(name, device=device, examples=examples, semantics=semantics, seeds=seeds, seed=seed))
        progress(_line(rows[-1]))
    return clean_row, rows


def _clean_row(device: str, examples: int, semantics: str, progress, seeds: bool, seed: int | None) -> dict:
    clean = run_campaign(ReferenceTarget(), device=device, semantics=semantics, examples=examples, shrink=False,
                         seeds=seeds, seed=seed)
    broken = run_probes(ReferenceTarget())
    clean_row = {"name": "(clean reference)", "cases": clean.cases, "findings": len(clean.findings) + len(broken),
                 "finding": clean.findings[0].message if clean.findings else (broken[0] if broken else None)}
    progress(f"clean reference: {clean.cases} cases, {clean_row['findings']} finding(s)")
    return clean_row


def judge_mutant(name: str, *, device: str = "cpu", examples: int = 200, semantics: str = "0.5.23",
                 seeds: bool = True, seed: int | None = None) -> dict:
    """One row of the table: the campaign against the mutant, then the contract probes."""
    m = MUTANTS[name]
    target = mutant_target(name)
    r = run_campaign(target, target_spec=TargetSpec(mutant=name), device=device, semantics=semantics,
                     examples=examples, seeds=seeds, seed=seed)
    return _row(m, [f.oracle for f in r.findings], r.first_detection_examples, r.first_detection_seconds,
                r.minimal.case.summary() if r.minimal else None, r.minimal.replay if r.minimal else None,
                run_probes(target))


def _row(m, oracles, examples, seconds, minimal, replay, broken) -> dict:
    oracles = sorted(set(oracles) | ({"contract"} if broken else set()))
    return {
        "name": m.name, "description": m.description, "source": m.source, "expected_oracle": m.expected_oracle,
        "killed": bool(oracles), "oracle": oracles[0] if oracles else None, "oracles": oracles,
        "examples_to_detect": examples,
        "seconds_to_detect": None if seconds is None else round(seconds, 3),
        "minimal_case": minimal or (broken[0] if broken else None), "replay": replay,
        "contract_failures": broken,
    }


def _line(row: dict) -> str:
    return (f"{row['name']:32} {'KILLED' if row['killed'] else 'ALIVE '} {','.join(row['oracles']):40} "
            f"{row['examples_to_detect']} ex {row['seconds_to_detect']} s  {row['minimal_case'] or ''}")


def _kill_table_isolated(names, *, examples: int, semantics: str, progress, with_clean: bool,
                         seeds: bool, seed: int | None) -> tuple[dict | None, list[dict]]:
    """On CUDA each campaign runs in its own process: a mutant that kills the CUDA context (an
    illegal access, a device-side assert) is a finding, not the end of the table. The campaigns run several
    at once, sharing the GPU (a case is mostly host work): one per `CUDA_JOBS_PER_CAMPAIGN` cores, each judging
    that many cases at once. The rows do not depend on it: a campaign's count, first detection and shrunk case
    are those of one case at a time (`run --jobs`)."""
    def campaign(mutant):
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, "-m", "harness", "run", "--device", "cuda", "--examples", str(examples),
                   "--jobs", str(CUDA_JOBS_PER_CAMPAIGN),
                   "--semantics", semantics, "--report-dir", tmp, *TargetSpec(mutant=mutant).arguments()] + (
                [] if seeds else ["--no-seeds"]) + ([] if seed is None else ["--seed", str(seed)])
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CUDA_CAMPAIGN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                return None, f"timed out after {CUDA_CAMPAIGN_TIMEOUT_S}s"
            path = Path(tmp) / "summary.json"
            if not path.is_file():
                return None, f"process exited {proc.returncode} without a summary: {proc.stderr.strip()[-300:]}"
            return json.loads(path.read_text()), None

    clean, rows = None, []
    with ThreadPoolExecutor(max(1, cpu_cores() // CUDA_JOBS_PER_CAMPAIGN)) as pool:
        clean_campaign = pool.submit(campaign, None) if with_clean else None
        campaigns = [pool.submit(campaign, name) for name in names]
        if clean_campaign is not None:
            clean_summary, error = clean_campaign.result()
            if clean_summary is None:
                pool.shutdown(cancel_futures=True)  # the mutants' campaigns not started yet never start
                raise EnvironmentBroken(f"the clean CUDA campaign did not finish: {error}")
            clean = {"name": "(clean reference)", "cases": clean_summary["cases"],
                     "findings": len(clean_summary["findings"]),
                     "finding": clean_summary["findings"][0]["message"] if clean_summary["findings"] else None}
            progress(f"clean reference: {clean['cases']} cases, {clean['findings']} finding(s)")
        for name, done in zip(names, campaigns):  # in the table's order, each once it and those before are in
            summary, error = done.result()
            findings = summary["findings"] if summary else []
            first = summary.get("first_detection") if summary else None
            oracles = [f["oracle"] for f in findings] + (["execution"] if error else [])
            rows.append(_row(MUTANTS[name], oracles, first and first["examples"], first and first["seconds"],
                             findings[0]["case_summary"] if findings else error,
                             findings[0]["replay"] if findings else None, run_probes(mutant_target(name))))
            progress(_line(rows[-1]))
    return clean, rows


def run_kill_table(*, device: str, examples: int, semantics: str, report_dir: Path, only=None,
                   shard: Shard = WHOLE, seeds: bool = True, seed: int | None = None) -> int:
    clean, rows = kill_table(device=device, examples=examples, semantics=semantics, only=only, shard=shard, seeds=seeds,
                             seed=seed, progress=lambda line: print(line, flush=True))

    def build(folder: Path) -> None:
        if clean is not None:
            write_report(folder / CLEAN_REFERENCE, clean)
        write_report(folder / TABLE, rows)
        render_folder(folder, shown_as=report_dir)

    replace_report(report_dir, (TABLE, CLEAN_REFERENCE, junit.MUTANTS, "index.html"), build)
    killed = [r for r in rows if r["killed"]]
    by_campaign = [r for r in killed if r["seconds_to_detect"] is not None]  # the rest: by a contract probe
    seconds = [r["seconds_to_detect"] for r in by_campaign]
    clean_note = (f"clean reference: {clean['findings']} finding(s)" if clean
                  else f"clean reference: in shard 1, not {shard}")
    print(f"{len(killed)}/{len(rows)} mutants killed{' (shard ' + str(shard) + ')' if shard.count > 1 else ''}; "
          f"{clean_note}")
    if seconds:
        examples_to_detect = [r["examples_to_detect"] for r in by_campaign]
        print(f"time to detection: median {statistics.median(seconds):.2f}s, worst {max(seconds):.2f}s; "
              f"examples: median {statistics.median(examples_to_detect)}, worst {max(examples_to_detect)}"
              f"{' (no seed cases)' if not seeds else ''}{f' (seed {seed})' if seed is not None else ''}; "
              f"{len(killed) - len(by_campaign)} killed by a contract probe alone")
    print(f"table: {report_dir / TABLE}", file=sys.stderr)
    print(f"page: {report_dir / 'index.html'}")
    # a survivor, or a finding on the clean reference: the table cannot vouch for the oracles (the page's BROKEN)
    return ExitCode.OK if len(killed) == len(rows) and not (clean and clean["findings"]) else ExitCode.BROKEN
