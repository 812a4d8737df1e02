"""`python -m harness explore`: every interleaving of one case the events allow, on the CPU simulator."""

from __future__ import annotations

from harness.commands.options import read_case, target_spec_of
from harness.device import DeviceKind, resolve_device
from harness.engine import explore
from harness.errors import ExitCode, InvalidArgument
from harness.oracles import parse_oracles


def run(args) -> int:
    if resolve_device(args.device, option="--device") is not DeviceKind.CPU:
        raise InvalidArgument("explore runs on the CPU simulator only: use --device cpu")
    case = read_case(args.case)
    outcome = explore(target_spec_of(args).load(), case, bound=args.bound,
                      oracles=parse_oracles(args.oracles, "--oracles"))
    per_oracle = ", ".join(f"{name} {count}" for name, count in sorted(outcome.by_oracle.items()))
    print(f"explored {outcome.explored} interleaving(s){' (bound reached)' if outcome.truncated else ' (all)'}; "
          f"{len(outcome.failing)} with findings{' (' + per_oracle + ')' if per_oracle else ''}")
    for schedule, finding in outcome.failing[:10]:
        print(f"  forced:{schedule}  [{finding.oracle}/{finding.kind}] {finding.message}")
    return ExitCode.FOUND if outcome.failing else ExitCode.OK
