"""Cases per second on the CPU simulator (and CUDA when present), small and real-size geometries,
eager and graph replay, with where each case's time goes (`CaseResult.phases()`): the target's
overlapped forward, the barriered reference's forward, the target's own set-up (its pools and forward
batch), and the harness itself: drawing the world, copying the outputs, the oracles (the float64
reference apart). `harness/fwds` is the harness's time over the two forwards' (the target: at most
0.5). Prints a table and writes JSON.

    python benchmarks/cases_per_second.py [--device cpu|cuda] [--cases N] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import time

from harness.case import Batch, Case, Dims, Flags, Mutation, Request
from harness.engine import run_case
from harness.findings import PHASES
from harness.targets import ReferenceTarget

MUTATIONS = (Mutation("swa_clear", count=4), Mutation("req_to_token_rewrite", count=2))


def geometries():
    small = Dims()
    real = Dims(heads=64, head_dim=512, swa_window=128, index_topk=512, index_dim=8, page_size=256)
    yield "small eager", Case(dims=small, batches=(Batch(requests=(Request(20, 9), Request(3, 6)), mutations=MUTATIONS),))
    yield "small graph", Case(dims=small, batches=(Batch(requests=(Request(20, 9), Request(3, 6)), graph=True,
                                                         mutations=MUTATIONS),))
    yield "threshold eager (11674 tokens, tiny heads)", Case(
        flags=Flags(SGLANG_OPT_FLASHMLA_SPARSE_PREFILL=False),
        dims=Dims(heads=1, head_dim=4, page_size=256, layer_ratios=(0,)),
        batches=(Batch(requests=(Request(0, 6000), Request(8, 5674)), mutations=MUTATIONS),))
    yield "real heads eager (64x512, 2 requests)", Case(dims=real, batches=(
        Batch(requests=(Request(600, 300), Request(100, 212)), mutations=MUTATIONS),))
    yield "real heads graph (64x512, 512 bucket)", Case(dims=real, batches=(
        Batch(requests=(Request(600, 300), Request(100, 200)), graph=True, mutations=MUTATIONS),))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cases", type=int, default=20)
    parser.add_argument("--out", default="benchmarks/cases_per_second.json")
    args = parser.parse_args()
    target, rows = ReferenceTarget(), []
    columns = ("overlapped fwd", "barriered fwd", "target setup", "world", "copies", "float64", "other oracles",
               "rest")
    print(f"{'geometry':44} {'cases/s':>8} " + " ".join(f"{c:>{max(7, len(c))}}" for c in columns)
          + f" {'harness/fwds':>13}")
    for name, case in geometries():
        n = max(1, args.cases if "small" in name else args.cases // 10)
        run_case(target, case, args.device)  # warm-up
        start = time.perf_counter()
        spent = dict.fromkeys(PHASES, 0.0)
        float64 = 0.0
        for seed in range(n):
            result = run_case(target, Case(**{**case.__dict__, "data_seed": seed}), args.device)
            assert not result.findings, result.findings
            for phase, seconds in result.phases().items():
                spent[phase] += seconds
            float64 += result.oracle_seconds.get("float64", 0.0)
        total = time.perf_counter() - start
        overlapped = spent["overlapped_forward"] + spent["race_delay"]  # the geometries inject no delay
        forwards = overlapped + spent["barriered_forward"]
        harness = total - forwards - spent["target_setup"]
        shares = {"overlapped fwd": overlapped, "barriered fwd": spent["barriered_forward"],
                  "target setup": spent["target_setup"], "world": spent["world"], "copies": spent["output_copies"],
                  "float64": float64, "other oracles": spent["oracles"] - float64,
                  "rest": total - sum(spent.values()) + spent["other"]}
        row = {"geometry": name, "device": args.device, "cases": n, "cases_per_second": n / total,
               **{f"share_{k.replace(' ', '_')}": v / total for k, v in shares.items()},
               "share_harness": harness / total, "harness_over_forwards": harness / forwards}
        rows.append(row)
        print(f"{name:44} {row['cases_per_second']:8.2f} "
              + " ".join(f"{shares[c] / total:>{max(7, len(c))}.0%}" for c in columns)
              + f" {row['harness_over_forwards']:13.2f}")
    print("\nhow a case's cost grows (small heads, eager, ms per case):")
    print(f"{'tokens':>8} " + " ".join(f"{r:>4} req" for r in (1, 4, 16)))
    for tokens in (16, 256, 2048, 8192):
        costs = []
        for requests in (1, 4, 16):
            per = max(1, tokens // requests)
            case = Case(batches=(Batch(requests=tuple(Request(8, per) for _ in range(requests)), mutations=MUTATIONS),))
            start = time.perf_counter()
            run_case(target, case, args.device)
            costs.append((time.perf_counter() - start) * 1000)
            rows.append({"scaling_tokens": tokens, "requests": requests, "ms_per_case": costs[-1]})
        print(f"{tokens:>8} " + " ".join(f"{c:8.0f}" for c in costs))
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
