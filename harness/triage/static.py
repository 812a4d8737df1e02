"""The source half of `python -m harness triage`: which classes it checks, and `triage --static-only`, the
source check alone (no object built, no campaign)."""

from __future__ import annotations

import sys
from importlib.metadata import version
from pathlib import Path

from harness.case import Batch, Case, Request
from harness.contracts.source import check_classes, module_classes, static_section
from harness.device import SimDevice
from harness.errors import ExitCode
from harness.sglang_target.classes import sglang_classes
from harness.strategies import with_dims
from harness.targets import TargetSpec
from reports.schema import TRIAGE
from reports.writers import write_report


def triage_classes(session) -> list[type]:
    """The classes triage checks on the source: for the sglang target every class of the real modules it
    drives; otherwise the built backend, runner and scheduler classes and every class of their modules."""
    if getattr(session, "api", None) is not None:
        return sglang_classes()[0]
    runner = session.model_runner
    explicit = [type(runner.attn_backend), type(runner), type(getattr(session, "scheduler", runner))]
    metadata = getattr(runner.attn_backend, "metadata_cls", None)
    explicit += [metadata] if isinstance(metadata, type) else []
    return list(dict.fromkeys(explicit + module_classes(sys.modules[k.__module__] for k in explicit)))


def static_triage(args, target_spec: TargetSpec) -> int:
    """`triage --static-only`: the source check alone (no object built, no campaign) of the target `target_spec`
    names. With --target sglang the modules are imported by name, so it also runs on versions the target cannot
    drive."""
    missing: list[str] = []
    if target_spec.spec == "sglang":
        classes, missing = sglang_classes()
        name = f"sglang-{version('sglang')}"
    else:
        target = target_spec.load()
        case = with_dims(Case(batches=(Batch(requests=(Request(3, 5),)),)), tuple(getattr(target, "fixed_dims", {}).items()))
        classes = triage_classes(target.open(case, SimDevice()))
        name = getattr(target, "name", target_spec.spec)
    section = static_section(check_classes(classes))
    path = Path(args.report_dir) / TRIAGE
    write_report(path, {"target": name, "static_only": True, "static_missing_modules": missing, **section})
    print(f"{len(section['static_breaks'])} static break(s) in {len(classes)} classes"
          f"{f' ({len(missing)} module(s) absent: ' + ', '.join(missing) + ')' if missing else ''}; report: {path}")
    return ExitCode.FOUND if section["static_breaks"] else ExitCode.OK
