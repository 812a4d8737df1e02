"""The systems under test: the protocol (`protocol.py`), the reference model behind it (`reference.py`),
and `load_target`, which turns a `--target` value into a target.

The built-in names are `module:factory` strings, resolved like any other: this package never imports the
targets built on it (the sglang target in `harness.sglang_target`, the seeded bugs in
`harness.mutants.corpus`), so they sit on a floor above it.
"""

from __future__ import annotations

import importlib
from typing import Callable

from harness.errors import EnvironmentBroken, InvalidArgument
from harness.targets.protocol import Session, Target, load_batch
from harness.targets.reference import Classes, ReferenceSession, ReferenceTarget

# `--target NAME` for the built-in names; anything else is `module:factory`.
BUILTIN_TARGETS = {"reference": "harness.targets.reference:ReferenceTarget",
                   "sglang": "harness.sglang_target:make_target"}
MUTANT_FACTORY = "harness.mutants.corpus:mutant_target"  # --mutant NAME: the reference with one seeded bug


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


def load_target(spec: str, *, mutant: str | None = None, names: tuple[str, str] = ("target", "mutant")) -> Target:
    """`reference`, `sglang` (the names of BUILTIN_TARGETS), or `module:factory`; `names`: what the caller
    calls the target and the mutant, in the messages (the command line: --target, --mutant)."""
    name, mutant_name = names
    if mutant is not None:
        if spec != "reference":
            raise InvalidArgument(f"{mutant_name} applies to {name} reference only, not {spec!r}")
        return resolve_factory(MUTANT_FACTORY, spec, name)(mutant)
    if spec in BUILTIN_TARGETS:
        return resolve_factory(BUILTIN_TARGETS[spec], spec, name)()
    target = resolve_factory(spec, spec, name)()
    if not isinstance(target, Target):
        raise InvalidArgument(f"{name} {spec}: the factory returned a {type(target).__name__}, not a "
                              "harness.targets.protocol.Target (subclass it and implement open(case, device))")
    return target


__all__ = ["BUILTIN_TARGETS", "MUTANT_FACTORY", "Classes", "ReferenceSession", "ReferenceTarget", "Session", "Target",
           "load_batch", "load_target", "resolve_factory"]
