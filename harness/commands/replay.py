"""`python -m harness replay`: one case, exactly as a finding's replay command gives it, with its executed order."""

from __future__ import annotations

from harness.commands.options import read_case, target_spec_of
from harness.device import resolve_device
from harness.engine import run_case
from harness.errors import ExitCode
from harness.oracles import parse_oracles


def run(args) -> int:
    case = read_case(args.case)
    device = resolve_device(args.device, option="--device")
    target_spec = target_spec_of(args)
    result = run_case(target_spec.load(), case, device, schedule=args.schedule, target_spec=target_spec,
                      oracles=parse_oracles(args.oracles, "--oracles"))
    print(f"case: {case.summary()}")
    print(f"schedule: {args.schedule}; executed order: forced:{result.overlapped.schedule}")
    for line in result.overlapped.trace:
        print(f"    {line}")
    for finding in result.findings:
        print(f"[{finding.oracle}/{finding.kind}] {finding.message}")
    print(f"{len(result.findings)} finding(s)")
    return ExitCode.FOUND if result.findings else ExitCode.OK
