"""The kill table: the clean reference and every mutant, each through the same campaign."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.campaign import run_campaign
from reports.writers import write_json_atomically
from harness.errors import EnvironmentBroken, InvalidArgument
from harness.mutants import MUTANTS, mutant_target
from harness.target import ReferenceTarget

CUDA_CAMPAIGN_TIMEOUT_S = 300


def kill_table(*, device: str = "cpu", examples: int = 200, semantics: str = "0.5.23", only=None,
               progress=lambda line: None) -> tuple[dict, list[dict]]:
    names = list(MUTANTS)
    if only:
        names = [n.strip() for n in only.split(",") if n.strip()]
        unknown = [n for n in names if n not in MUTANTS]
        if unknown:
            raise InvalidArgument(f"--only: unknown mutant(s) {', '.join(unknown)}; allowed: {', '.join(MUTANTS)}")
    if device == "cuda":
        return _kill_table_isolated(names, examples=examples, semantics=semantics, progress=progress)
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


def _kill_table_isolated(names, *, examples: int, semantics: str, progress) -> tuple[dict, list[dict]]:
    """On CUDA each campaign runs in its own process: a mutant that kills the CUDA context (an
    illegal access, a device-side assert) is a finding, not the end of the table."""
    def campaign(mutant):
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, "-m", "harness", "run", "--device", "cuda", "--examples", str(examples),
                   "--semantics", semantics, "--report-dir", tmp] + (["--mutant", mutant] if mutant else [])
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CUDA_CAMPAIGN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                return None, f"timed out after {CUDA_CAMPAIGN_TIMEOUT_S}s"
            path = Path(tmp) / "summary.json"
            if not path.is_file():
                return None, f"process exited {proc.returncode} without a summary: {proc.stderr.strip()[-300:]}"
            return json.loads(path.read_text()), None

    clean_summary, error = campaign(None)
    if clean_summary is None:
        raise EnvironmentBroken(f"the clean CUDA campaign did not finish: {error}")
    clean = {"name": "(clean reference)", "cases": clean_summary["cases"], "findings": len(clean_summary["findings"]),
             "finding": clean_summary["findings"][0]["message"] if clean_summary["findings"] else None}
    progress(f"clean reference: {clean['cases']} cases, {clean['findings']} finding(s)")
    rows = []
    for name in names:
        m = MUTANTS[name]
        summary, error = campaign(name)
        findings = summary["findings"] if summary else []
        oracles = sorted({f["oracle"] for f in findings}) or (["execution"] if error else [])
        first = summary.get("first_detection") if summary else None
        row = {"name": name, "description": m.description, "source": m.source, "expected_oracle": m.expected_oracle,
               "killed": bool(findings) or error is not None, "oracle": oracles[0] if oracles else None,
               "oracles": oracles, "examples_to_detect": first and first["examples"],
               "seconds_to_detect": first and first["seconds"],
               "minimal_case": findings[0]["case_summary"] if findings else error,
               "replay": findings[0]["replay"] if findings else None}
        rows.append(row)
        progress(f"{name:32} {'KILLED' if row['killed'] else 'ALIVE '} {','.join(oracles):40} "
                 f"{row['examples_to_detect']} ex {row['seconds_to_detect']} s  {row['minimal_case'] or ''}")
    return clean, rows


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
