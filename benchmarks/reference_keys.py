"""The float64 reference's two ways of meeting its keys (`reference_attention(keys=...)`), timed on one
device at real head sizes (64 x 512, window 128, top-k 512) for one request of each length, on the
float64 oracle's checked rows of three layers (best of three). `MASKED_LATENTS_PER_WINDOW` in
harness/model/attention.py is set from this table on an H200: masked wins for short requests (fewer
launches), gathered for long ones (the masked scores grow with the request).

    python benchmarks/reference_keys.py [--device cuda|cpu] [--tokens 300,600,1200,2400,8000]
"""

from __future__ import annotations

import argparse
import time

import torch

from harness.case import Batch, Case, Dims, Request
from harness.model.attention import reference_attention
from harness.oracles.float64 import rows_to_check
from harness.world import PoolSizes, build_world

REAL = Dims(heads=64, head_dim=512, swa_window=128, index_topk=512, index_dim=8, page_size=256)


def best_of_three(world, rows, keys: str) -> float:
    best = float("inf")
    for _ in range(3):
        if world.device.type == "cuda":
            torch.cuda.synchronize()
        began = time.perf_counter()
        for layer in range(len(world.dims.layer_ratios)):
            out = reference_attention(world, layer, rows=rows, keys=keys)
        float(out.sum())  # waits for the device
        best = min(best, time.perf_counter() - began)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tokens", default="300,600,1200,2400,8000")
    args = parser.parse_args()
    print(f"{'tokens':>7} {'gathered ms':>12} {'masked ms':>10} {'masked/gathered':>16}")
    for tokens in (int(t) for t in args.tokens.split(",")):
        case = Case(dims=REAL, batches=(Batch(requests=(Request(tokens - 200, 200),)),))
        world = build_world(case, 0, PoolSizes.for_case(case), args.device)
        rows = rows_to_check(world.num_tokens)
        gathered, masked = best_of_three(world, rows, "gathered"), best_of_three(world, rows, "masked")
        print(f"{tokens:>7} {gathered * 1e3:>12.2f} {masked * 1e3:>10.2f} {masked / gathered:>16.2f}")


if __name__ == "__main__":
    main()
