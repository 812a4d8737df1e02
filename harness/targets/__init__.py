"""The systems under test: the protocol (`protocol.py`), the reference model behind it (`reference.py`),
`TargetSpec`, the target a run names (`--target`, `--mutant`) as one record, and `load_target`, which turns
a `--target` value into a target.

The built-in names are `module:factory` strings, resolved like any other: this package never imports the
targets built on it (the sglang target in `harness.sglang_target`, the seeded bugs in
`harness.mutants.corpus`), so they sit on a floor above it.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from typing import Callable

from harness.errors import EnvironmentBroken, InvalidArgument
from harness.targets.protocol import Session, Target, load_batch
from harness.targets.reference import Classes, ReferenceSession, ReferenceTarget

# `--target NAME` for the built-in names; anything else is `module:factory`.
BUILTIN_TARGETS = {"reference": "harness.targets.reference:ReferenceTarget",
                   "sglang": "harness.sglang_target:make_target"}
MUTANT_FACTORY = "harness.mutants.corpus:mutant_target"  # --mutant NAME: the reference with one seeded bug
# A server's settings that a target reads from the process environment, as the server reads them at start-up: a
# deployment's choice (its value is the same for every case), not a case's. A replay command sets again those set,
# so that it replays against the same server.
SERVER_ENVIRONMENT = ("SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH",)


def resolve_factory(spec: str, shown: str, name: str = "target") -> Callable:
    """The callable a `module:factory` string names; `shown` is the target as given, `name` what the caller
    calls it (the command line: --target), both in the messages. A module that is not there is a usage error
    (exit 2), as an unknown built-in name is; one that is there but fails to import (a missing dependency:
    sglang behind `--target sglang`) a broken environment (3)."""
    module_name, sep, factory_name = spec.partition(":")
    if not sep or not module_name or not factory_name:
        raise InvalidArgument(f"{name}={shown!r} is not one of: {', '.join(BUILTIN_TARGETS)}, MODULE:FACTORY")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if module_name == exc.name or module_name.startswith(f"{exc.name}."):  # the module named is not there
            raise InvalidArgument(f"{name}={shown!r}: no module named {module_name!r}; allowed: "
                                  f"{', '.join(BUILTIN_TARGETS)}, or MODULE:FACTORY of an importable module") from None
        raise EnvironmentBroken(f"{name} {shown}: cannot import {module_name!r} ({exc})") from None
    except ImportError as exc:
        raise EnvironmentBroken(f"{name} {shown}: cannot import {module_name!r} ({exc})") from None
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise InvalidArgument(f"{name} {shown}: {module_name!r} has no callable {factory_name!r}")
    return factory


@dataclass(frozen=True)
class TargetSpec:
    """The target a run names: `spec` (`reference`, `sglang` or `module:factory`) and `mutant` (one seeded bug
    of the reference, or None). One record, made once from the command line, so that the target a campaign
    loads, the one an isolated child rebuilds, the example database's scope and the replay command read the
    same pair: as two strings carried side by side they could disagree.

    A mutant on another target is refused as the record is made, before any work. `names`: what the maker
    calls the target and the mutant, in the messages (the command line: --target, --mutant); not part of
    the value, so it is neither compared nor sent to a child, which answers in the library's words."""

    spec: str = "reference"
    mutant: str | None = None
    names: tuple[str, str] = field(default=("target", "mutant"), compare=False, repr=False)

    def __post_init__(self):
        name, mutant_name = self.names
        if self.mutant is not None and self.spec != "reference":
            raise InvalidArgument(f"{mutant_name} applies to {name} reference only, not {self.spec!r}")

    def load(self) -> Target:
        """The target itself; a spec that names no target (no such module or factory, a factory that returns
        something else) is refused naming it, one whose module cannot be imported is a broken environment."""
        name, _ = self.names
        if self.mutant is not None:
            return resolve_factory(MUTANT_FACTORY, self.spec, name)(self.mutant)
        if self.spec in BUILTIN_TARGETS:
            return resolve_factory(BUILTIN_TARGETS[self.spec], self.spec, name)()
        target = resolve_factory(self.spec, self.spec, name)()
        if not isinstance(target, Target):
            raise InvalidArgument(f"{name} {self.spec}: the factory returned a {type(target).__name__}, not a "
                                  "harness.targets.protocol.Target (subclass it and implement open(case, device))")
        return target

    def arguments(self) -> list[str]:
        """The command line's `--target SPEC [--mutant NAME]` that names this target again (a replay command's,
        a worker's)."""
        return ["--target", self.spec] + (["--mutant", self.mutant] if self.mutant else [])

    @staticmethod
    def environment() -> list[str]:
        """`NAME=VALUE` for each server setting of `SERVER_ENVIRONMENT` this process has: what a replay command
        sets before it (read when asked, as the target reads them: a worker or child inherits them)."""
        return [f"{name}={os.environ[name]}" for name in SERVER_ENVIRONMENT if name in os.environ]

    def to_dict(self) -> dict:
        """The value as JSON can carry it (an isolated child's request); `from_dict` reads it back."""
        return {"spec": self.spec, "mutant": self.mutant}

    @classmethod
    def from_dict(cls, data: dict) -> TargetSpec:
        return cls(data["spec"], data["mutant"])


REFERENCE = TargetSpec()  # the default: the clean reference model


def load_target(spec: str, *, mutant: str | None = None, names: tuple[str, str] = ("target", "mutant")) -> Target:
    """`reference`, `sglang` (the names of BUILTIN_TARGETS), or `module:factory`; `names`: what the caller
    calls the target and the mutant, in the messages (the command line: --target, --mutant)."""
    return TargetSpec(spec, mutant, names).load()


__all__ = ["BUILTIN_TARGETS", "MUTANT_FACTORY", "REFERENCE", "SERVER_ENVIRONMENT", "Classes", "ReferenceSession",
           "ReferenceTarget", "Session", "Target", "TargetSpec", "load_batch", "load_target", "resolve_factory"]
