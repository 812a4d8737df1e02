"""`python -m harness nightly`: the flags checked, naming them, before any step runs; the steps, their
report and the exit code are `harness.nightly`'s."""

from __future__ import annotations

from pathlib import Path

from harness.device import resolve_device
from harness.errors import InvalidArgument
from harness.example_db import check_shared
from harness.nightly import plan, run_nightly
from harness.sharding import Shard
from reports.schema import MUTANTS, NIGHTLY, SUMMARY
from reports.writers import refuse_other_runs


def run(args) -> int:
    shard = Shard.parse(args.shard, "--shard")
    if shard.count > 1 and args.seed is None:
        raise InvalidArgument(f"--shard={args.shard} needs --seed S, the same on every host, so that the hosts' "
                              "campaigns are parts of one case stream")
    example_dbs = tuple(check_shared(spec, "--example-db") for spec in args.example_db)
    # no GPU on --device cuda: exit 3 now, not four failed steps later
    device = resolve_device(args.device, option="--device")
    skip = args.skip
    if shard.index > 1:
        print(f"[sanitize] runs in shard 1 of {shard.count} only")
        skip |= {"sanitize"}
    report_dir = Path(args.report_dir)
    refuse_other_runs(report_dir, (NIGHTLY, SUMMARY, MUTANTS), overwrite=args.overwrite, name="--report-dir",
                      overwrite_name="--overwrite")
    steps = plan(report_dir, device=device, examples=args.examples, workers=args.workers, semantics=args.semantics,
                 skip=skip, shard=shard, overwrite=args.overwrite, progress_every=args.progress_every, seed=args.seed,
                 example_dbs=example_dbs, target=args.target, self_tests=args.self_tests)
    return run_nightly(report_dir, steps, skip, device)
