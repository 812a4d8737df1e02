"""The harness's error types: one for bad input, one for a broken environment; and the exit code of
its own failure, which must never read as 1, "found"."""

from __future__ import annotations

import traceback

INTERNAL_ERROR_EXIT = 5  # the harness itself raised: neither a finding (1) nor an interruption (4)


class HarnessError(Exception):
    """Base of every error the harness raises on purpose (raised as itself, the harness's own failure)."""

    exit_code = INTERNAL_ERROR_EXIT


class InvalidArgument(HarnessError, ValueError):
    """Bad usage or configuration: the message names the field and the allowed values (exit 2)."""

    exit_code = 2


class EnvironmentBroken(HarnessError):
    """Something the run needs is missing or broken: a tool, a package, a device (exit 3)."""

    exit_code = 3


def describe_internal_error(exc: BaseException) -> str:
    """One line for an exception the harness did not raise on purpose: what, and the innermost frame."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else ""
    return (f"internal error: the harness itself failed (not the system under test), exit {INTERNAL_ERROR_EXIT}: "
            f"{type(exc).__name__}: {exc}{where}")
