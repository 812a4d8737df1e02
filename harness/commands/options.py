"""What the subcommands' runs share: the checks of values more than one of them reads when it runs
(their options, and the parser, are in `harness.commands.parsers`)."""

from __future__ import annotations

from pathlib import Path

from harness.case import SEMANTICS, Case, Flags
from harness.errors import InvalidArgument
from harness.mutants.corpus import MUTANTS
from harness.targets import TargetSpec
from harness.validation import check_one_of


def check_semantics(value: str) -> str:
    if value not in SEMANTICS:
        raise InvalidArgument(f"--semantics={value!r} is not one of: {', '.join(SEMANTICS)}")
    return value


def check_target_semantics(target, value: str, name: str = "--semantics") -> str:
    """`value` if `target` implements that semantics (`Target.semantics_supported`), else the error naming the flag
    and what the target implements, before any case: a case of another semantics is refused by the target's
    session, inside the campaign (the installed sglang 0.5.22, say, runs `pr` only)."""
    supported = getattr(target, "semantics_supported", SEMANTICS)
    if value not in supported:
        raise InvalidArgument(f"{name}={value!r}: target {getattr(target, 'name', '?')} implements "
                              f"{', '.join(supported)} only (give {name} {supported[0]})")
    return value


def parse_without(value: str) -> frozenset[str]:
    """`--without`: comma-separated gate switches a campaign never turns on, or paths under a gate it never takes
    (`Flags.PATHS`; empty: none)."""
    names = frozenset(name.strip() for name in value.split(",") if name.strip())
    unknown = sorted(names - set(Flags.GATES + Flags.PATHS))
    if unknown:
        raise InvalidArgument(f"--without={value!r}: {', '.join(unknown)} is not a gate switch or a path under one; "
                              f"allowed: {', '.join(Flags.GATES + Flags.PATHS)}")
    return names


def target_spec_of(args) -> TargetSpec:
    """--target and --mutant as the one record every later step reads, checked now, before any work, naming
    the flags: a --mutant that is not a seeded bug of the corpus (the corpus itself names its parameter), or
    one on a target other than reference. The record's own messages name the flags too, when it loads."""
    if args.mutant is not None and args.target == "reference":
        check_one_of(args.mutant, MUTANTS, "--mutant")
    return TargetSpec(args.target, args.mutant, names=("--target", "--mutant"))


def read_case(text: str) -> Case:
    """`--case`: the case as JSON, or @FILE."""
    if text.startswith("@"):
        path = Path(text[1:])
        if not path.is_file():
            raise InvalidArgument(f"--case {text}: no such file")
        text = path.read_text()
    return Case.from_json(text)
