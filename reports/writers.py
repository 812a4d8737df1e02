"""Report files, written so that a killed run never leaves a half-written file that looks whole.

Each file is written to a temporary sibling, flushed to disk, then renamed over the target in one
step (`os.replace` is atomic on POSIX and Windows): a reader sees the old file or the new one, never
a prefix of the new one. A failure on the way removes the temporary file and leaves the target as
it was. A run's set of files (its summary, its JUnit, its page) is replaced the same way, one folder
rename for all of them (`replace_report`).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Callable

from harness.errors import InvalidArgument


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


def refuse_other_runs(report_dir: Path, own_files: tuple[str, ...], *, overwrite: bool,
                      flag: str = "--report-dir") -> None:
    """A report folder that already holds a run of this kind (one of `own_files`) is another run's:
    refused (exit 2, naming it) unless `overwrite`, so that a second run never silently replaces the
    first. Called before any work."""
    report_dir = Path(report_dir)
    if report_dir.exists() and not report_dir.is_dir():
        raise InvalidArgument(f"{flag} {report_dir}: exists and is not a directory")
    held = [name for name in own_files if (report_dir / name).exists()]
    if held and not overwrite:
        raise InvalidArgument(f"{flag} {report_dir}: the folder holds another run's report ({', '.join(held)}); "
                              "choose another folder, or pass --overwrite to replace it")


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
        swap_in(staging, report_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


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
