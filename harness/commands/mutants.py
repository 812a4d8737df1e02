"""`python -m harness mutants`: the kill table of the seeded-bug corpus (`harness.mutants`)."""

from __future__ import annotations

from pathlib import Path

from harness.errors import ExitCode, InvalidArgument
from harness.kill_table import run_kill_table
from harness.mutants.corpus import MUTANTS
from harness.sharding import Shard
from reports.writers import refuse_other_runs


def run(args) -> int:
    if args.list:
        for m in MUTANTS.values():
            print(f"{m.name}\t{m.expected_oracle}\t{m.description}")
        return ExitCode.OK
    unknown = [name for name in (n.strip() for n in (args.only or "").split(",")) if name and name not in MUTANTS]
    if unknown:
        raise InvalidArgument(f"--only: unknown mutant(s) {', '.join(unknown)}; allowed: {', '.join(MUTANTS)}")
    semantics = args.semantics
    shard = Shard.parse(args.shard, "--shard")
    report_dir = Path(args.report_dir)
    refuse_other_runs(report_dir, ("mutants.json",), overwrite=args.overwrite, name="--report-dir",
                      overwrite_name="--overwrite")
    return run_kill_table(device=args.device, examples=args.examples, semantics=semantics, report_dir=report_dir,
                          only=args.only, shard=shard, seeds=not args.no_seeds, seed=args.seed)
