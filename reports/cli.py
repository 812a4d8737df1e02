"""`python -m harness report DIR`: render a report folder's page and JUnit files from its JSON.

The runs call `render_folder` after writing their JSON; this command re-renders a folder by hand,
for example after copying it from a CI machine. A corrupt or partial JSON is an error naming the
file and the field (exit 2), never a page that looks clean.
"""

from __future__ import annotations

from pathlib import Path

from harness.errors import EnvironmentBroken, ExitCode
from reports import junit
from reports.folder import load_folder
from reports.verdict import BROKEN, FOUND, INTERRUPTED, Verdict, verdict_of

EXIT_CODES = {FOUND: ExitCode.FOUND, BROKEN: ExitCode.BROKEN, INTERRUPTED: ExitCode.INTERRUPTED}  # CLEAN: ExitCode.OK


def render_folder(path: Path, pytest_junit: Path | None = None,
                  shown_as: Path | None = None) -> tuple[list[Path], Verdict]:
    """Write index.html and the JUnit files of the runs present; returns the files written and the verdict.
    `shown_as`: the folder's final name, when `path` is a staging copy about to be renamed to it."""
    try:  # jinja2 and matplotlib load only when a report is rendered, not on every CLI start
        from reports.html import write_index
    except ImportError as exc:
        raise EnvironmentBroken(f"rendering the report page needs jinja2 and matplotlib: {exc} "
                                "(pip install -e . installs them)") from None

    folder = load_folder(path, pytest_junit)
    folder.shown_as = shown_as
    written = []
    if folder.summary is not None:
        written.append(junit.write(folder.path / junit.CAMPAIGN, junit.campaign_suite(folder.summary)))
    if folder.mutants is not None:
        written.append(junit.write(folder.path / junit.MUTANTS, junit.mutants_suite(folder.mutants, folder.clean_reference)))
    if folder.sanitizer is not None:
        written.append(junit.write(folder.path / junit.SANITIZER, junit.sanitizer_suite(folder.sanitizer)))
    written.append(write_index(folder))
    return written, verdict_of(folder)


def run(args) -> int:
    """Exit 0 clean, 1 found, 3 broken, 4 interrupted: the verdict the page shows."""
    written, verdict = render_folder(Path(args.dir))
    for path in written:
        print(f"wrote {path}")
    print(f"{verdict.status}: {verdict.reason}")
    return EXIT_CODES.get(verdict.status, ExitCode.OK)
