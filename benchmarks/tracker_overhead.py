"""The happens-before tracker's cost: the same cases with the tracker and with a no-op in its place,
measured in one run, as a ratio. (PyTorch CSAN's ratio on the same workload needs a GPU: see
BENCHMARKS.md.)

    python benchmarks/tracker_overhead.py [--cases N] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import time

import harness.device.base as base
from harness.case import Batch, Case, Mutation, Request
from harness.engine import execute
from harness.hb import HappensBefore
from harness.target import ReferenceTarget


class Untracked:
    """Accepts every call and records nothing."""

    conflicts: list = []

    def __getattr__(self, name):
        return lambda *args, **kwargs: []


def timed(cases, tracker_cls) -> float:
    base.HappensBefore = tracker_cls
    start = time.perf_counter()
    for case in cases:
        execute(ReferenceTarget(), case, "cpu")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--out", default="benchmarks/tracker_overhead.json")
    args = parser.parse_args()
    mut = (Mutation("swa_clear", count=4), Mutation("req_to_token_rewrite", count=2))
    cases = [Case(data_seed=i, batches=(Batch(requests=(Request(20, 9), Request(3, 6)), graph=bool(i % 2),
                                              mutations=mut),)) for i in range(args.cases)]
    timed(cases[:5], HappensBefore)  # warm-up
    untracked = min(timed(cases, Untracked) for _ in range(3))  # best of three each
    tracked = min(timed(cases, HappensBefore) for _ in range(3))
    row = {"cases": args.cases, "untracked_s": untracked, "tracked_s": tracked, "ratio": tracked / untracked}
    print(f"{args.cases} runs: untracked {untracked:.2f}s, tracked {tracked:.2f}s, ratio {row['ratio']:.2f}x")
    with open(args.out, "w") as f:
        json.dump(row, f, indent=2)


if __name__ == "__main__":
    main()
