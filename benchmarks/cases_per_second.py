"""Cases per second on the CPU simulator (and CUDA when present), small and real-size geometries,
eager and graph replay, with the share of each case spent in the target's overlapped forward, in the
barriered reference's forward, in the target's own set-up (its pools and forward batch), and in the
harness itself (world building, output copies, the six oracles); `harness/fwds` is the harness's time
over the two forwards' (the target: at most 0.5). Prints a table and writes JSON.

    python benchmarks/cases_per_second.py [--device cpu|cuda] [--cases N] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import time

from harness.case import Batch, Case, Dims, Flags, Mutation, Request
from harness.engine import run_case
from harness.target import ReferenceTarget

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
    print(f"{'geometry':44} {'cases/s':>8} {'overlapped fwd':>15} {'barriered fwd':>14} {'target setup':>13} "
          f"{'harness':>8} {'harness/fwds':>13}")
    for name, case in geometries():
        n = max(1, args.cases if "small" in name else args.cases // 10)
        run_case(target, case, args.device)  # warm-up
        start = time.perf_counter()
        sut_a = sut_b = setup = 0.0
        for seed in range(n):
            result = run_case(target, Case(**{**case.__dict__, "data_seed": seed}), args.device)
            assert not result.findings, result.findings
            sut_a += result.overlapped.sut_seconds
            sut_b += result.barriered.sut_seconds
            setup += result.overlapped.setup_seconds + result.barriered.setup_seconds
        total = time.perf_counter() - start
        harness = total - sut_a - sut_b - setup
        row = {"geometry": name, "device": args.device, "cases": n, "cases_per_second": n / total,
               "share_overlapped_forward": sut_a / total, "share_barriered_forward": sut_b / total,
               "share_target_setup": setup / total, "share_harness": harness / total,
               "harness_over_forwards": harness / (sut_a + sut_b)}
        rows.append(row)
        print(f"{name:44} {row['cases_per_second']:8.2f} {row['share_overlapped_forward']:15.0%} "
              f"{row['share_barriered_forward']:14.0%} {row['share_target_setup']:13.0%} {row['share_harness']:8.0%} "
              f"{row['harness_over_forwards']:13.2f}")
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
