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


def resolve_factory(spec: str, shown: str) -> Callable:
    """The callable a `module:factory` string names; `shown` is the --target value in the messages. A
    module that is not there is a usage error (exit 2), as an unknown built-in name is; one that is there
    but fails to import (a missing dependency: sglang behind `--target sglang`) a broken environment (3)."""
    module_name, sep, factory_name = spec.partition(":")
    if not sep or not module_name or not factory_name:
        raise InvalidArgument(f"--target={shown!r} is not one of: {', '.join(BUILTIN_TARGETS)}, MODULE:FACTORY")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if module_name == exc.name or module_name.startswith(f"{exc.name}."):  # the module named is not there
            raise InvalidArgument(f"--target={shown!r}: no module named {module_name!r}; allowed: "
                                  f"{', '.join(BUILTIN_TARGETS)}, or MODULE:FACTORY of an importable module") from None
        raise EnvironmentBroken(f"--target {shown}: cannot import {module_name!r} ({exc})") from None
    except ImportError as exc:
        raise EnvironmentBroken(f"--target {shown}: cannot import {module_name!r} ({exc})") from None
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise InvalidArgument(f"--target {shown}: {module_name!r} has no callable {factory_name!r}")
    return factory


def load_target(spec: str, *, mutant: str | None = None) -> Target:
    """`reference`, `sglang` (the names of BUILTIN_TARGETS), or `module:factory`."""
    if mutant is not None:
        if spec != "reference":
            raise InvalidArgument(f"--mutant applies to --target reference only, not {spec!r}")
        return resolve_factory(MUTANT_FACTORY, spec)(mutant)
    if spec in BUILTIN_TARGETS:
        return resolve_factory(BUILTIN_TARGETS[spec], spec)()
    target = resolve_factory(spec, spec)()
    if not isinstance(target, Target):
        raise InvalidArgument(f"--target {spec}: the factory returned a {type(target).__name__}, not a "
                              "harness.targets.protocol.Target (subclass it and implement open(case, device))")
    return target


__all__ = ["BUILTIN_TARGETS", "MUTANT_FACTORY", "Classes", "ReferenceSession", "ReferenceTarget", "Session", "Target",
           "load_batch", "load_target", "resolve_factory"]
