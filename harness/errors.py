"""The harness's error types: one for bad input, one for a broken environment."""

from __future__ import annotations


class HarnessError(Exception):
    """Base of every error the harness raises on purpose."""

    exit_code = 1


class InvalidArgument(HarnessError, ValueError):
    """Bad usage or configuration: the message names the field and the allowed values (exit 2)."""

    exit_code = 2


class EnvironmentBroken(HarnessError):
    """Something the run needs is missing or broken: a tool, a package, a device (exit 3)."""

    exit_code = 3
