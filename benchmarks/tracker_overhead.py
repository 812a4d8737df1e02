"""The happens-before tracker's cost: the same cases with the tracker and with a no-op in its place,
measured in one run, as a ratio; then the observer (`harness/observe/`) on top of the tracker,
against the unobserved run, per run and per judged case (`run_case` observes the overlapped run
only, the one the happens-before oracle judges), on the benchmark's small cases and on the
campaign's seed cases of both semantics (every protocol shape, the 11673-token threshold case among
them); on CUDA also PyTorch's CSAN (with our tracker off) on the same cases.

CSAN is measured last: importing it switches on torch's GPU trace hooks for the rest of the process.

    python benchmarks/tracker_overhead.py [--device cpu|cuda] [--cases N] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time

import harness.device.base as base
from harness.case import Batch, Case, Mutation, Request
from harness.engine import execute, run_case
from harness.hb import HappensBefore
from harness.strategies import seed_cases
from harness.targets import ReferenceTarget


class Untracked:
    """Accepts every call and records nothing."""

    conflicts: list = []

    def __getattr__(self, name):
        return lambda *args, **kwargs: []


def timed(cases, tracker_cls, device: str, observe=contextlib.nullcontext, observer: bool = False) -> float:
    base.HappensBefore = tracker_cls
    start = time.perf_counter()
    for case in cases:
        with observe():
            execute(ReferenceTarget(), case, device, observe=observer)
    return time.perf_counter() - start


def judged_time(cases, device: str, observe: bool) -> float:
    """Whole cases as a campaign judges them: both runs and every oracle."""
    base.HappensBefore = HappensBefore
    start = time.perf_counter()
    for case in cases:
        run_case(ReferenceTarget(), case, device, observe=observe)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--out", default="benchmarks/tracker_overhead.json")
    args = parser.parse_args()
    mut = (Mutation("swa_clear", count=4), Mutation("req_to_token_rewrite", count=2))
    cases = [Case(data_seed=i, batches=(Batch(requests=(Request(20, 9), Request(3, 6)), graph=bool(i % 2),
                                              mutations=mut),)) for i in range(args.cases)]
    timed(cases[:5], HappensBefore, args.device, observer=True)  # warm-up
    untracked = min(timed(cases, Untracked, args.device) for _ in range(3))  # best of three each
    tracked = min(timed(cases, HappensBefore, args.device) for _ in range(3))
    observed = min(timed(cases, HappensBefore, args.device, observer=True) for _ in range(3))
    judged = {flag: min(judged_time(cases, args.device, flag) for _ in range(3)) for flag in (False, True)}
    seeds = seed_cases("0.5.23") + seed_cases("pr")
    seeded = {flag: min(judged_time(seeds, args.device, flag) for _ in range(3)) for flag in (False, True)}
    row = {"device": args.device, "cases": args.cases, "untracked_s": untracked, "tracked_s": tracked,
           "ratio": tracked / untracked, "observed_s": observed, "observer_ratio": observed / tracked,
           "judged_unobserved_s": judged[False], "judged_observed_s": judged[True],
           "judged_observer_ratio": judged[True] / judged[False],
           "seed_cases": len(seeds), "seed_unobserved_s": seeded[False], "seed_observed_s": seeded[True],
           "seed_observer_ratio": seeded[True] / seeded[False]}
    line = (f"{args.cases} runs on {args.device}: untracked {untracked:.2f}s, ours {tracked:.2f}s "
            f"({row['ratio']:.2f}x), ours with the observer {observed:.2f}s ({row['observer_ratio']:.2f}x the "
            f"unobserved run); {args.cases} judged cases: unobserved {judged[False]:.2f}s, observed "
            f"{judged[True]:.2f}s ({row['judged_observer_ratio']:.2f}x); {len(seeds)} seed cases judged: unobserved "
            f"{seeded[False]:.2f}s, observed {seeded[True]:.2f}s ({row['seed_observer_ratio']:.2f}x)")
    if args.device == "cuda":
        from harness.csan import CsanObserver

        observer = CsanObserver()
        csan = min(timed(cases, Untracked, args.device, observer.observing) for _ in range(3))
        row.update(csan_s=csan, csan_ratio=csan / untracked)
        line += f", CSAN {csan:.2f}s ({row['csan_ratio']:.2f}x)"
    print(line)
    with open(args.out, "w") as f:
        json.dump(row, f, indent=2)


if __name__ == "__main__":
    main()
