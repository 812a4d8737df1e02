"""The fast path on a real GPU: how long before the forward's end the scheduler's stream starts on a batch's result
(issue 30's figure; the `fast-path` oracle judges the same thing by order, this measures it in time).

The engine notes, where the scheduler starts on the result (after its barrier), two timing events: one on the
scheduler's stream, one at the forward stream's tail (`Device.mark_processing`; `RunRecord.overlap_ms`). A
batch that publishes read-done lets the scheduler start while the forward still runs (a positive overlap, up
to the forward's length after the shared reads); a batch that does not publish, or a barrier that waits on the
whole forward, starts after it (zero or negative). Each row runs the same cases overlapped only (no barriered
run, no oracles), without the observer unless `--observe` (it adds host work between the launches), at DSV4's
head sizes so that a forward lasts long enough to overlap. A CUDA campaign tallies the same figure over the cases it
judges (`summary.json`'s `fast_path_overlap`, `harness/overlap.py`); this script holds the geometry and the mutant.

    python benchmarks/fast_path_overlap.py [--target reference|sglang] [--cases N] [--mutant NAME ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace

import torch

from harness.case import Batch, Case, Dims, Flags, Mutation, Request
from harness.engine import execute
from harness.policy import expected_publish
from harness.strategies import with_dims
from harness.targets import load_target

MUTATIONS = (Mutation("swa_clear", count=4), Mutation("req_to_token_rewrite", count=2))
REAL_HEADS = Dims(heads=64, head_dim=512, swa_window=128, index_topk=512, index_dim=8, page_size=256)


def geometries() -> dict[str, Case]:
    """Publishing and not, eager and graph: the same requests, so that the forwards are alike."""
    requests = (Request(600, 300), Request(100, 212))
    extend = Batch(requests=requests, mutations=MUTATIONS)
    return {
        "EXTEND eager, read-done on": Case(dims=REAL_HEADS, batches=(extend,)),
        "EXTEND graph, read-done on": Case(dims=REAL_HEADS, batches=(replace(extend, graph=True),)),
        "EXTEND eager, read-done off": Case(dims=REAL_HEADS, batches=(extend,),
                                            flags=Flags(SGLANG_ENABLE_PREFILL_WAR_READ_DONE=False)),
    }


def measure(target, case: Case, cases: int, observe: bool) -> dict:
    overlaps, published = [], 0
    execute(target, case, "cuda", observe=observe)  # warm-up: kernels compiled, graphs captured once
    for seed in range(cases):
        run = execute(target, replace(case, data_seed=seed), "cuda", observe=observe)
        if run.crash:
            raise SystemExit(f"the case crashed at batch {run.crash[0]}: {run.crash[1]}")
        for batch, ms in zip(case.batches, run.overlap_ms):
            if ms is None:
                raise SystemExit("the scheduler never started on a batch's result: no overlap to measure")
            overlaps.append(ms)
            published += expected_publish(case, batch)[0]
    return {"batches": len(overlaps), "publish_expected": published, "median_ms": statistics.median(overlaps),
            "min_ms": min(overlaps), "max_ms": max(overlaps),
            "share_overlapped": sum(ms > 0 for ms in overlaps) / len(overlaps)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="reference", help="reference, sglang or module:factory")
    parser.add_argument("--mutant", action="append", default=[],
                        help="also a reference mutant by name (repeatable), e.g. barrier_waits_forward_after_publish")
    parser.add_argument("--cases", type=int, default=20, help="cases per row (each a new data seed)")
    parser.add_argument("--observe", action="store_true", help="with the observer on, as a campaign runs")
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("error: the overlap is measured on a real GPU; no CUDA device here")
    targets = {args.target: load_target(args.target)}
    targets.update({f"mutant {name}": load_target("reference", mutant=name) for name in args.mutant})
    rows = []
    print(f"{'target':44} {'geometry':30} {'batches':>7} {'publish':>7} {'median ms':>9} {'min':>8} {'max':>8} "
          f"{'overlapped':>10}")
    for label, target in targets.items():
        for name, case in geometries().items():
            case = replace(with_dims(case, tuple(getattr(target, "fixed_dims", {}).items())),
                           graph_contract=target.graph_contracts[-1])  # bcg where the target has it
            row = {"target": label, "geometry": name, **measure(target, case, args.cases, args.observe)}
            rows.append(row)
            print(f"{label:44} {name:30} {row['batches']:7} {row['publish_expected']:7} {row['median_ms']:9.3f} "
                  f"{row['min_ms']:8.3f} {row['max_ms']:8.3f} {row['share_overlapped']:10.0%}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
