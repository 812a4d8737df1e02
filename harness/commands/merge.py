"""`python -m harness merge DIR... --into DIR`: the folders merged by `reports.merge`, its refusals naming
--into and --overwrite, and what was written."""

from __future__ import annotations

from pathlib import Path

from harness.errors import ExitCode
from reports.cli import EXIT_CODES
from reports.merge import merge_folders


def run(args) -> int:
    """Exit 0 clean, 1 found, 3 broken (the merged page's verdict), 2 for a folder that does not belong."""
    written, verdict, summary = merge_folders(args.dirs, Path(args.into), overwrite=args.overwrite,
                                              into_name="--into", overwrite_name="--overwrite")
    if summary is not None:
        print(f"campaign: {summary['cases']} cases from {len(summary['workers'])} part(s), "
              f"{len(summary['findings'])} finding(s)")
    for path in written:
        print(f"wrote {path}")
    print(f"{verdict.status}: {verdict.reason}")
    return EXIT_CODES.get(verdict.status, ExitCode.OK)
