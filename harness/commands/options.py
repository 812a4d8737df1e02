"""What the subcommands share: the parser class (usage errors exit 2), the options every case-running
subcommand takes, and the validators of values more than one subcommand reads."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.case import SEMANTICS, Case, Flags
from harness.errors import ExitCode, InvalidArgument
from harness.oracles import oracle_names
from harness.validation import one_of


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default, once; a required option's with "(required)"; an
    option without a default (None, or [] for a repeatable one) says in its help what none means,
    never "(default: None)"."""

    def _get_help_string(self, action):
        text = action.help or ""
        if not action.option_strings:  # a positional: its help says what it is, and what none means
            return text
        if action.required:
            return f"{text} (required)"
        if "%(default)" in text or "(default:" in text or action.default in (None, []):
            return text
        return super()._get_help_string(action)


class HarnessParser(argparse.ArgumentParser):
    """Usage errors exit 2, as ours do; every option's help ends with its default (`HelpFormatter`)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.print_usage(sys.stderr)
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(ExitCode.USAGE)


def add_common_options(p) -> None:
    """--target, --device, --mutant and --oracles: the options of every subcommand that judges cases."""
    p.add_argument("--target", default="reference", help="reference | sglang | MODULE:FACTORY")
    p.add_argument("--device", type=one_of("cpu", "cuda", "auto"), default="auto",
                   help="cpu | cuda | auto (cuda when a GPU is visible)")
    p.add_argument("--mutant", default=None, help="run against one seeded bug of the corpus (mutants --list; "
                                                  "none given: the target as it is)")
    p.add_argument("--oracles", default=None,
                   help=f"comma-separated subset of: {', '.join(oracle_names())} (none given: all)")


def check_semantics(value: str) -> str:
    if value not in SEMANTICS:
        raise InvalidArgument(f"--semantics={value!r} is not one of: {', '.join(SEMANTICS)}")
    return value


def parse_without(value: str) -> frozenset[str]:
    """`--without`: comma-separated gate switches a campaign never turns on (empty: none)."""
    names = frozenset(name.strip() for name in value.split(",") if name.strip())
    unknown = sorted(names - set(Flags.GATES))
    if unknown:
        raise InvalidArgument(f"--without={value!r}: {', '.join(unknown)} is not a gate switch; allowed: "
                              f"{', '.join(Flags.GATES)}")
    return names


def read_case(text: str) -> Case:
    """`--case`: the case as JSON, or @FILE."""
    if text.startswith("@"):
        path = Path(text[1:])
        if not path.is_file():
            raise InvalidArgument(f"--case {text}: no such file")
        text = path.read_text()
    return Case.from_json(text)
