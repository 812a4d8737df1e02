"""The kill table: the clean reference and every mutant, each through the same campaign."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from harness.campaign import run_campaign
from reports.writers import write_json_atomically
from harness.errors import InvalidArgument
from harness.mutants import MUTANTS, mutant_target
from harness.target import ReferenceTarget


def kill_table(*, device: str = "cpu", examples: int = 200, semantics: str = "0.5.23", only=None,
               progress=lambda line: None) -> tuple[dict, list[dict]]:
    names = list(MUTANTS)
    if only:
        names = [n.strip() for n in only.split(",") if n.strip()]
        unknown = [n for n in names if n not in MUTANTS]
        if unknown:
            raise InvalidArgument(f"--only: unknown mutant(s) {', '.join(unknown)}; allowed: {', '.join(MUTANTS)}")
    clean = run_campaign(ReferenceTarget(), device=device, semantics=semantics, examples=examples, shrink=False)
    clean_row = {"name": "(clean reference)", "cases": clean.cases, "findings": len(clean.findings),
                 "finding": clean.findings[0].message if clean.findings else None}
    progress(f"clean reference: {clean.cases} cases, {len(clean.findings)} finding(s)")
    rows = []
    for name in names:
        m = MUTANTS[name]
        r = run_campaign(mutant_target(name), target_spec="reference", device=device, semantics=semantics,
                         examples=examples, mutant=name)
        oracles = sorted({f.oracle for f in r.findings})
        row = {
            "name": name, "description": m.description, "source": m.source, "expected_oracle": m.expected_oracle,
            "killed": bool(r.findings), "oracle": oracles[0] if oracles else None, "oracles": oracles,
            "examples_to_detect": r.first_detection_examples,
            "seconds_to_detect": None if r.first_detection_seconds is None else round(r.first_detection_seconds, 3),
            "minimal_case": r.minimal.case.summary() if r.minimal else None,
            "replay": r.minimal.replay if r.minimal else None,
        }
        rows.append(row)
        progress(f"{name:32} {'KILLED' if row['killed'] else 'ALIVE '} {','.join(oracles):40} "
                 f"{row['examples_to_detect']} ex {row['seconds_to_detect']} s  {row['minimal_case'] or ''}")
    return clean_row, rows


def run_kill_table(*, device: str, examples: int, semantics: str, report_dir: Path, only=None) -> int:
    clean, rows = kill_table(device=device, examples=examples, semantics=semantics, only=only,
                             progress=lambda line: print(line, flush=True))
    write_json_atomically(report_dir / "mutants.json", rows)
    killed = [r for r in rows if r["killed"]]
    seconds = [r["seconds_to_detect"] for r in killed]
    print(f"{len(killed)}/{len(rows)} mutants killed; clean reference: {clean['findings']} finding(s)")
    if seconds:
        print(f"time to detection: median {statistics.median(seconds):.2f}s, worst {max(seconds):.2f}s; "
              f"examples: worst {max(r['examples_to_detect'] for r in killed)}")
    print(f"table: {report_dir / 'mutants.json'}", file=sys.stderr)
    return 0 if len(killed) == len(rows) and not clean["findings"] else 1
