"""The command line's value checks, in Hypothesis's style (`hypothesis.internal.validation`): small
functions, each an argparse `type=` that names what is allowed. argparse prefixes the option's name,
so every bad value is a usage error (exit 2) naming the option and the allowed values, before any
work, and a default from pyproject.toml is checked by the same function. Nothing here imports more
than the standard library: a usage error is answered without loading torch."""

from __future__ import annotations

import argparse
import math
from typing import Callable, Optional

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
