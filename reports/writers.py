"""Report files, written so that a killed run never leaves a half-written file that looks whole.

Each file is written to a temporary sibling, flushed to disk, then renamed over the target in one
step (`os.replace` is atomic on POSIX and Windows): a reader sees the old file or the new one, never
a prefix of the new one. A failure on the way removes the temporary file and leaves the target as
it was. A run's set of files (its summary, its JUnit, its page) is replaced the same way, one folder
rename for all of them (`replace_report`). A report file's JSON is written only once its schema
(reports/schema.py) has accepted it (`write_report`), so the folder never holds a file its reader refuses.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Callable

from harness.errors import InvalidArgument
from reports.schema import check_written


def write_bytes_atomically(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")  # the umask's permissions
    try:
        with open(tmp, "xb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomically(path: Path, text: str) -> None:
    write_bytes_atomically(path, text.encode("utf-8"))


def write_json_atomically(path: Path, data) -> None:
    write_text_atomically(path, json.dumps(data, indent=2) + "\n")


def write_report(path: Path, data) -> None:
    """The report file `path` (summary.json, mutants.json, ...: its name picks its schema), written
    atomically once its schema has accepted the text; a field the schema refuses or does not declare is
    the writer's bug (`UnwritableReport`, exit 5), and nothing is written."""
    path = Path(path)
    text = json.dumps(data, indent=2) + "\n"
    check_written(path.name, text)
    write_text_atomically(path, text)


def report_folder(value: str) -> Path:
    """argparse `type=` of every report folder option: refused before any work (exit 2) when the run
    could not replace it at its end. The folder is swapped in by renaming a staging sibling over it,
    so it must have a name of its own (not "", ".", ".." or "/": `out/..` was once copied into its
    own staging folder until the name was too long), must not be the working folder or hold it, and
    the folder its staging sibling goes into must be creatable (not under /proc, not under a file)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("an empty path: give the report folder's name")
    path = Path(value)
    if path.name in ("", ".", ".."):
        raise argparse.ArgumentTypeError(f"{value!r} ends in '.', '..' or '/': the report folder is replaced by a "
                                         "rename, so it needs a name of its own (harness-report, say)")
    resolved, here = path.resolve(), Path.cwd().resolve()
    if resolved == here or resolved in here.parents:
        raise argparse.ArgumentTypeError(f"{value!r} is the working folder or holds it: the report folder is "
                                         "replaced as a whole; give a folder of its own")
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{value}: exists and is not a directory")
    _check_creatable(resolved.parent, value)
    return path


def _check_creatable(parent: Path, value: str) -> None:
    """The nearest existing folder above `parent` (or `parent` itself) takes a new folder: tried, not guessed
    from permission bits (root may write anywhere by those, yet not under /proc)."""
    existing = next(folder for folder in (parent, *parent.parents) if folder.exists())
    if not existing.is_dir():
        raise argparse.ArgumentTypeError(f"{value}: {existing} is a file, so no folder can be made under it")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".harness-probe-", dir=existing))
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"{value}: no folder can be made in {existing} ({exc.strerror})") from None


def refuse_other_runs(report_dir: Path, own_files: tuple[str, ...], *, overwrite: bool,
                      name: str = "report_dir", overwrite_name: str = "overwrite") -> None:
    """A report folder that already holds a run of this kind (one of `own_files`) is another run's:
    refused (exit 2, naming it) unless `overwrite`, so that a second run never silently replaces the
    first. Called before any work. `name` and `overwrite_name`: the caller's names for `report_dir`
    and `overwrite` in the message (the commands' flags), so that this module never names a flag."""
    report_dir = Path(report_dir)
    if report_dir.exists() and not report_dir.is_dir():
        raise InvalidArgument(f"{name} {report_dir}: exists and is not a directory")
    held = [file for file in own_files if (report_dir / file).exists()]
    if held and not overwrite:
        raise InvalidArgument(f"{name} {report_dir}: the folder holds another run's report ({', '.join(held)}); "
                              f"choose another folder, or pass {overwrite_name} to replace it")
    for left in leftover_staging(report_dir):
        if any(left.iterdir()):
            print(f"warning: {left} was left by a run that was killed while it wrote its report into {report_dir}; "
                  "it may hold that report: look at it, then remove it", file=sys.stderr)
        else:
            shutil.rmtree(left, ignore_errors=True)


# `new_staging_folder`'s names, and `swap_in`'s name for the old folder on its way out
_STAGING = re.compile(r"\.(?P<name>.+)\.(?P<pid>\d+)\.[0-9a-f]{8}\.(new|old)")


def leftover_staging(report_dir: Path) -> list[Path]:
    """The staging folders of `report_dir` whose run is dead: a run killed (SIGKILL, power loss) between
    writing its staging folder and renaming it over the report leaves it behind, hidden."""
    report_dir = Path(report_dir)
    if not report_dir.parent.is_dir():
        return []
    left = []
    for entry in sorted(report_dir.parent.iterdir()):
        match = _STAGING.fullmatch(entry.name)
        if match and match["name"] == report_dir.name and entry.is_dir() and not _alive(int(match["pid"])):
            left.append(entry)
    return left


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def replace_report(report_dir: Path, replaced: tuple[str, ...], build: Callable[[Path], None],
                   staging: Path | None = None) -> None:
    """The folder changes in one step: `build(staging)` writes the new files into a sibling staging
    folder that already holds everything of the old folder except `replaced` (hard links, so nothing
    is copied), then the staging folder is renamed over the old one. A run killed on the way leaves
    the old folder whole (and a hidden staging folder beside it), never a mix of two runs.
    `staging`: one from `new_staging_folder` that the run has already written into (its workers' folders)."""
    report_dir = Path(report_dir)
    staging = staging or new_staging_folder(report_dir)
    try:
        if report_dir.is_dir():
            for entry in report_dir.iterdir():
                if entry.name not in replaced and not (staging / entry.name).exists():
                    _link(entry, staging / entry.name)
        build(staging)
    except Exception as exc:
        # A build that failed after writing this run's files (the summary, then a page that could not render) keeps
        # them: they go in, without the page, which `harness report` renders again. One that wrote none of them
        # leaves the old folder as it was.
        if not any((staging / name).exists() for name in replaced):
            shutil.rmtree(staging, ignore_errors=True)
            raise
        swap_in(staging, report_dir)
        exc.add_note(f"this run's files are in {report_dir}, without the page: `python -m harness report "
                     f"{report_dir}` renders it once the cause is fixed")
        raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    swap_in(staging, report_dir)


def new_staging_folder(report_dir: Path) -> Path:
    """A hidden sibling of `report_dir` (same file system, so it can be renamed over it)."""
    report_dir = Path(report_dir)
    report_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = report_dir.parent / f".{report_dir.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.new"
    staging.mkdir()
    return staging


def swap_in(staging: Path, report_dir: Path) -> None:
    """Renames `staging` to `report_dir`, the old folder first moved aside and then removed."""
    if report_dir.is_dir():
        old = staging.with_suffix(".old")
        os.rename(report_dir, old)
        os.rename(staging, report_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(staging, report_dir)


def _link(source: Path, target: Path) -> None:
    if source.is_dir():
        shutil.copytree(source, target, copy_function=_link_file)
    else:
        _link_file(source, target)


def _link_file(source, target) -> None:
    try:
        os.link(source, target)
    except OSError:  # a file system without hard links
        shutil.copy2(source, target)
