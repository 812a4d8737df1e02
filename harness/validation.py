"""The command line's value checks, in Hypothesis's style (`hypothesis.internal.validation`): small
functions, each an argparse `type=` that names what is allowed. argparse prefixes the option's name,
so every bad value is a usage error (exit 2) naming the option and the allowed values, before any
work, and a default from pyproject.toml is checked by the same function. Below them, the library's
own checks (`check_positive(value, name)`): the caller passes the name it knows the value by, so
the library never names a flag. Nothing here imports more than the standard library and
`harness.errors`: a usage error is answered without loading torch."""

from __future__ import annotations

import argparse
import math
from typing import Callable, Optional

from harness.errors import InvalidArgument

# The most cases one command line may ask for: a million is days of a nightly's campaign. A larger
# count was once taken as given: the progress line's range overflowed (exit 5) after an ETA of
# 43 million hours.
MAX_EXAMPLES = 1_000_000


def integer(low: int, high: Optional[int] = None) -> Callable[[str], int]:
    """An argparse `type=` for an integer option from `low` to `high` (no upper bound when None):
    anything else is a usage error naming the option and the range, before any work."""
    allowed = f"an integer >= {low}" if high is None else f"an integer from {low} to {high:,}"

    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {allowed}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{text} is out of range: {allowed}")
        return value

    convert.__name__ = allowed
    return convert


def seconds(text: str) -> float:
    """An argparse `type=` for a duration: a finite number of seconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"{text}: a finite number of seconds >= 0")
    return value


def positive_seconds(text: str) -> float:
    """An argparse `type=` for a time limit: a finite number of seconds > 0."""
    value = seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"{text}: a time limit must be more than 0 seconds")
    return value


def names_from(*allowed: str) -> Callable[[str], frozenset[str]]:
    """An argparse `type=` for a comma-separated set of words from `allowed` (empty: none); the error names the
    unknown ones and lists the allowed."""
    def convert(text: str) -> frozenset[str]:
        names = frozenset(n.strip() for n in text.split(",") if n.strip())
        unknown = sorted(names - set(allowed))
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown)}; allowed: {', '.join(allowed)}")
        return names

    convert.__name__ = " | ".join(allowed)
    return convert


def count_or_auto(what: str) -> Callable[[str], Optional[int]]:
    """An argparse `type=` for a count >= 1 of `what`, or auto (None: the command decides)."""
    allowed = f"a number of {what} >= 1, or auto"

    def convert(text: str) -> Optional[int]:
        if text == "auto":
            return None
        if not text.isdigit() or int(text) < 1:
            raise argparse.ArgumentTypeError(f"{text!r} is not {allowed}")
        return int(text)

    convert.__name__ = allowed
    return convert


def timeout_or_off(text: str):
    """An argparse `type=` for a timeout: seconds > 0, off (None), or auto (kept: it depends on the device)."""
    if text in ("auto", "off"):
        return None if text == "off" else text
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a timeout in seconds > 0, off, or auto")
    return value


def target_spec(text: str) -> str:
    """An argparse `type=` for a target: a built-in name, or MODULE:FACTORY (imported when the run starts)."""
    module, sep, factory = text.partition(":")
    if text not in ("reference", "sglang") and not (sep and module and factory):
        raise argparse.ArgumentTypeError(f"{text!r} is not one of: reference, sglang, MODULE:FACTORY")
    return text


def one_of(*allowed: str) -> Callable[[str], str]:
    """An argparse `type=` for a word from `allowed`; the error lists them (argparse's `choices=` quotes
    each, and checks a default given in pyproject.toml only after the type)."""
    def convert(text: str) -> str:
        if text not in allowed:
            raise argparse.ArgumentTypeError(f"{text!r} is not one of: {', '.join(allowed)}")
        return text

    convert.__name__ = " | ".join(allowed)
    return convert


def check_positive(value: int, name: str) -> None:
    """A count of at least one, refused naming it as the caller knows it (`name`: a parameter, or the
    flag that gave it), as Hypothesis's `check_valid_integer(value, name)` does."""
    if value < 1:
        raise InvalidArgument(f"{name}={value!r}: must be >= 1")


def check_one_of(value: str, allowed, name: str) -> None:
    """A word from `allowed`, refused naming it as the caller knows it (`name`) and listing the words."""
    if value not in allowed:
        raise InvalidArgument(f"{name}={value!r} is not one of: {', '.join(allowed)}")
