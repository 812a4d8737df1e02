"""Detection speed: examples and seconds to the first detection of each seeded bug, median and worst,
from the corpus tool's kill table (every mutant through the same campaign as the clean reference).

    python benchmarks/detection_speed.py [--device cpu|cuda] [--examples N] [--semantics pr|0.5.23] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics

from harness.kill_table import kill_table


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--semantics", default="0.5.23", choices=("0.5.23", "pr"))
    parser.add_argument("--out", default="benchmarks/detection_speed.json")
    args = parser.parse_args()
    # each mutant's line as it is judged: on CUDA (a process per mutant) the table takes minutes
    clean, rows = kill_table(device=args.device, examples=args.examples, semantics=args.semantics,
                             progress=lambda line: print(line, flush=True))
    print(f"{'mutant':34} {'oracle':16} {'examples':>8} {'seconds':>8}")
    for row in rows:
        seconds = "-" if row["seconds_to_detect"] is None else f"{row['seconds_to_detect']:.2f}"
        examples = "-" if row["examples_to_detect"] is None else row["examples_to_detect"]
        print(f"{row['name']:34} {row['oracle'] or 'ALIVE':16} {examples:>8} {seconds:>8}")
    timed = [r for r in rows if r["seconds_to_detect"] is not None]
    seconds = [r["seconds_to_detect"] for r in timed]
    examples = [r["examples_to_detect"] for r in timed]
    summary = {
        "device": args.device, "semantics": args.semantics, "mutants": len(rows),
        "killed": sum(r["killed"] for r in rows), "clean_findings": clean["findings"],
        "median_seconds": statistics.median(seconds) if seconds else None, "worst_seconds": max(seconds, default=None),
        "median_examples": statistics.median(examples) if examples else None,
        "worst_examples": max(examples, default=None), "rows": rows,
    }
    print(f"\n{summary['killed']}/{len(rows)} killed ({len(rows) - len(timed)} by a contract probe alone); clean: "
          f"{clean['findings']} finding(s); median {summary['median_seconds']} s / {summary['median_examples']} "
          f"examples, worst {summary['worst_seconds']} s / {summary['worst_examples']} examples")
    with open(args.out, "w") as f:
        json.dump(summary, f, indent=2)


if __name__ == "__main__":
    main()
