"""The harness's error types: one for bad input, one for a broken environment; and the exit code of
its own failure, which must never read as 1, "found"."""

from __future__ import annotations

import traceback
from enum import IntEnum


class ExitCode(IntEnum):
    """Every command's exit code, the page's verdict and the nightly's outcome, in one place."""

    OK = 0  # every part that ran found nothing
    FOUND = 1  # something was found in the system under test (a finding, a contract break, a failed test)
    USAGE = 2  # bad input: the message names the field and the allowed values; nothing ran
    BROKEN = 3  # the run cannot vouch for itself: a missing tool or device, a surviving mutant, a missed planted bug
    INTERRUPTED = 4  # SIGINT or SIGTERM: stopped between cases, a valid partial report written
    INTERNAL = 5  # the harness itself raised (never 1: that would read as "found")


class HarnessError(Exception):
    """Base of every error the harness raises on purpose (raised as itself, the harness's own failure)."""

    exit_code = ExitCode.INTERNAL


class InvalidArgument(HarnessError, ValueError):
    """Bad usage or configuration: the message names the field and the allowed values (exit 2)."""

    exit_code = ExitCode.USAGE


class EnvironmentBroken(HarnessError):
    """Something the run needs is missing or broken: a tool, a package, a device (exit 3)."""

    exit_code = ExitCode.BROKEN


def describe_internal_error(exc: BaseException) -> str:
    """One line for an exception the harness did not raise on purpose: what, and the innermost frame."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else ""
    notes = "".join(f"; {note}" for note in getattr(exc, "__notes__", ()))
    return (f"internal error: the harness itself failed (not the system under test), exit {int(ExitCode.INTERNAL)}: "
            f"{type(exc).__name__}: {exc}{where}{notes}")
