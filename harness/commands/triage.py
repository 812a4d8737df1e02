"""`python -m harness triage`: the interface checks on the built backend and on its source, then a short
campaign, into triage.json; `--static-only` and `--versions` hand over to `harness.triage`."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from harness.campaign import run_campaign
from harness.case import Batch, Case, Request
from harness.commands.options import check_semantics, check_target_semantics, target_spec_of
from harness.contracts.objects import ENTRY_POINTS, check_object, reads_on_every_call
from harness.contracts.source import check_classes, static_section
from harness.device import make_device, resolve_device
from harness.errors import ExitCode, InvalidArgument
from harness.oracles import oracle_names, parse_oracles
from harness.strategies import with_dims
from harness.triage.static import static_triage, triage_classes
from harness.triage.versions import parse_versions, triage_versions
from reports.schema import TRIAGE
from reports.writers import write_report


def run(args) -> int:
    if args.versions is not None:
        return triage_versions(args, parse_versions(args.versions, "--versions"))
    target_spec = target_spec_of(args)
    if args.static_only:
        return static_triage(args, target_spec)
    device = resolve_device(args.device, option="--device")
    target = target_spec.load()
    semantics = (target.semantics_supported[0] if args.semantics == "auto"
                 else check_target_semantics(target, check_semantics(args.semantics)))
    case = with_dims(Case(semantics=semantics, batches=(Batch(requests=(Request(3, 5),)),)),
                     tuple(getattr(target, "fixed_dims", {}).items()))  # at the sizes the target runs
    session = target.open(case, make_device(device))
    backend = getattr(getattr(session, "model_runner", None), "attn_backend", None)
    if backend is None:
        raise InvalidArgument(f"triage --target {target_spec.spec}: its session has no model_runner.attn_backend, "
                              "the object triage checks; give a target whose session exposes its attention backend")
    entry_points = getattr(session, "contract_entry_points", ENTRY_POINTS)
    breaks = check_object(backend, entry_points)
    for b in breaks:
        print(f"[contract] {b}")
    every_call = {entry: reads_on_every_call(type(backend), entry) for entry in entry_points
                  if hasattr(type(backend), entry)}
    for entry, reads in every_call.items():
        for read in reads:
            print(f"[every call] {type(backend).__name__}.{entry} reads self.{read} (an object built without "
                  "__init__ must be given it)")
    static = static_section(check_classes(triage_classes(session)))
    oracles = parse_oracles(args.oracles, "--oracles")
    result = run_campaign(target, target_spec=target_spec, device=device, semantics=semantics,
                          examples=args.examples, oracles=oracles)
    for finding in result.findings:
        print(f"[{finding.oracle}/{finding.kind}] {finding.message}")
    if result.minimal:
        print(f"  replay: {result.minimal.replay}")
    report = {"target": getattr(target, "name", target_spec.spec), "device": device, "semantics": semantics,
              "contract_breaks": [asdict(b) for b in breaks],
              "every_call_reads": {entry: [asdict(r) for r in reads] for entry, reads in every_call.items()},
              **static,
              "campaign": {**result.summary(), "oracles": [name for name in oracle_names() if oracles is None or name in oracles]}}
    write_report(Path(args.report_dir) / TRIAGE, report)
    print(f"{len(breaks)} contract break(s), {len(static['static_breaks'])} static break(s) in "
          f"{len(static['static_classes'])} classes, {len(result.findings)} finding(s) in {result.cases} cases; "
          f"report: {Path(args.report_dir) / TRIAGE}")
    return ExitCode.FOUND if breaks or static["static_breaks"] or result.findings else ExitCode.OK
