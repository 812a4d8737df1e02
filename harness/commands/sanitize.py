"""`python -m harness sanitize`: the cases named on the command line checked against --tool and --target,
naming those flags, before any run; the runs and their report are `harness.sanitizer.cli`'s."""

from __future__ import annotations

from pathlib import Path

from harness.sanitizer.cli import sanitize, select


def run(args) -> int:
    tools, cases = select(args.tool, args.target, args.cases, tool_name="--tool", target_name="--target")
    return sanitize(tools, cases, target=args.target, report_dir=Path(args.report_dir), timeout=args.timeout,
                    jobs=args.jobs)
