"""Cases per second of a whole campaign, `python -m harness run` as a user starts it (isolated, as
by default on CUDA), in one process, with cases judged at once (`--jobs J`) and in worker processes
(`--workers W`, sharing the GPUs on CUDA with `--gpu-share`), measured in one run: the ratio is what
the jobs or workers gain on this host.

A campaign's case is mostly host work (drawing, the observer, the oracles) and, on CUDA, the race
gates that widen its windows; one process keeps one core busy and the GPU mostly idle. The table
gives each run's wall time (process start-up included), its rate, the summary's own rate, where its
time went (`summary.json`'s `time`, summed over the workers) and, on CUDA, how its race gates opened.

    python benchmarks/campaign_rate.py [--device cpu|cuda] [--examples N] [--seed S] [--runs 1,1x4,4]
                                       [--out FILE]

`--runs`: comma-separated runs, each W (W workers) or WxJ (W workers, each judging J cases at once);
1 is one process judging one case at a time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.commands.run import gate_counts, time_shares


def parse_run(text: str) -> tuple[int, int]:
    workers, _, jobs = text.partition("x")
    try:
        run = int(workers), int(jobs or 1)
    except ValueError:
        run = (0, 0)
    if min(run) < 1:
        raise SystemExit(f"--runs: {text!r} is not W or WxJ with W, J >= 1")
    return run


def campaign(device: str, examples: int, seed: int, workers: int, jobs: int, folder: Path) -> dict:
    command = [sys.executable, "-m", "harness", "run", "--device", device, "--examples", str(examples),
               "--seed", str(seed), "--report-dir", str(folder), "-q", "--jobs", str(jobs)]
    if workers > 1:
        command += ["--workers", str(workers)] + (["--gpu-share"] if device == "cuda" else [])
    began = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{done.stdout}{done.stderr}")
    summary = json.loads((folder / "summary.json").read_text())
    spent = summary.get("time") or {}
    return {"workers": workers, "jobs": jobs, "wall_s": round(wall, 2), "cases": summary["cases"],
            "cases_per_second": round(summary["cases"] / wall, 2),
            "campaign_cases_per_second": summary["cases_per_second"], "findings": len(summary["findings"]),
            "time": spent, "race_gates": summary.get("race_gates") or {}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--examples", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--runs", default="1,1x4,4", help="comma-separated runs: W workers, or WxJ (W workers "
                                                          "judging J cases at once each); 1 is one process")
    parser.add_argument("--out", default="benchmarks/campaign_rate.json")
    args = parser.parse_args()
    runs = [parse_run(text) for text in args.runs.split(",")]
    rows = []
    print(f"{'run':>7} {'wall s':>7} {'cases':>6} {'cases/s':>8} {'summary':>8} {'vs 1st':>6} {'findings':>8}  "
          "where the time went; race gates")
    with tempfile.TemporaryDirectory() as scratch:
        for index, (n, jobs) in enumerate(runs):
            row = campaign(args.device, args.examples, args.seed, n, jobs, Path(scratch) / f"run{index}-w{n}x{jobs}")
            rows.append(row)
            base = rows[0]["cases_per_second"]
            gates = gate_counts(row["race_gates"]) or "no race gates"
            print(f"{f'{n}x{jobs}':>7} {row['wall_s']:>7.1f} {row['cases']:>6} {row['cases_per_second']:>8.2f} "
                  f"{row['campaign_cases_per_second']:>8.2f} {row['cases_per_second'] / base:>6.2f} "
                  f"{row['findings']:>8}  {time_shares(row['time'])}; {gates}")
    Path(args.out).write_text(json.dumps({"device": args.device, "examples": args.examples, "seed": args.seed,
                                          "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
