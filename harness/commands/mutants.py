"""`python -m harness mutants`: the kill table of the seeded-bug corpus (`harness.mutants`)."""

from __future__ import annotations

from pathlib import Path

from harness.case import SEMANTICS
from harness.validation import MAX_EXAMPLES, integer, one_of
from harness.errors import ExitCode
from harness.mutants.corpus import MUTANTS
from harness.mutants.kill_table import run_kill_table
from harness.sharding import Shard
from reports.writers import refuse_other_runs, report_folder


def add_parser(sub) -> None:
    parser = sub.add_parser("mutants", help="run the clean reference and every seeded bug: the kill table")
    parser.add_argument("--device", type=one_of("cpu", "cuda"), default="cpu", help="cpu | cuda")
    parser.add_argument("--examples", type=integer(1, MAX_EXAMPLES), default=200, help="cases per campaign")
    parser.add_argument("--semantics", type=one_of(*SEMANTICS), default="0.5.23", help="pr | 0.5.23")
    parser.add_argument("--report-dir", type=report_folder, default="harness-report", help="the report folder")
    parser.add_argument("--overwrite", action="store_true", help="replace the kill table already in --report-dir")
    parser.add_argument("--only", default=None, help="comma-separated mutant names (none given: all)")
    parser.add_argument("--shard", default="1/1", help="K/N: part K of N of the mutants (the clean reference runs "
                                                        "in part 1)")
    parser.add_argument("--list", action="store_true", help="print the mutants, one a line, and exit")
    parser.add_argument("--no-seeds", action="store_true",
                         help="draw every case of each campaign: skip the hand-written seed cases")
    parser.add_argument("--seed", type=int, default=None,
                         help="hypothesis seed of every campaign (none given: the ci profile's fixed stream); another "
                              "seed shows whether a kill depends on one stream")


def run(args) -> int:
    if args.list:
        for m in MUTANTS.values():
            print(f"{m.name}\t{m.expected_oracle}\t{m.description}")
        return ExitCode.OK
    semantics = args.semantics
    shard = Shard.parse(args.shard)
    report_dir = Path(args.report_dir)
    refuse_other_runs(report_dir, ("mutants.json",), overwrite=args.overwrite)
    return run_kill_table(device=args.device, examples=args.examples, semantics=semantics, report_dir=report_dir,
                          only=args.only, shard=shard, seeds=not args.no_seeds, seed=args.seed)
