"""What a shard pays for drawing the whole case stream: one campaign, then part 1 of 2 and of 4,
in this process, on the CPU simulator, with one seed. A shard judges 1/N of the cases but draws all
of them; the difference between its time and 1/N of the whole campaign's, per case it skipped, is
what drawing a case costs.

    python benchmarks/shard_overhead.py [--examples N] [--seed S]
"""

from __future__ import annotations

import argparse
import time

from harness.campaign import run_campaign
from harness.sharding import Shard
from harness.targets import ReferenceTarget


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=600)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    whole_s = None
    print(f"{'shard':>6} {'cases':>6} {'seconds':>8} {'1/N of whole':>13} {'ms per skipped case':>20}")
    for count in (1, 2, 4):
        began = time.perf_counter()
        result = run_campaign(ReferenceTarget(), examples=args.examples, seed=args.seed, profile="dev",
                              shard=Shard(1, count))
        seconds = time.perf_counter() - began
        whole_s = whole_s or seconds
        share = whole_s / count
        extra_ms = (seconds - share) / (args.examples - result.cases) * 1000 if count > 1 else 0.0
        print(f"{'1/' + str(count):>6} {result.cases:>6} {seconds:>8.2f} {share:>13.2f} {extra_ms:>20.2f}")


if __name__ == "__main__":
    main()
