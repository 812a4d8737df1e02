"""`contract`: for a target that is not the model, an attribute its source reads as `self.X` but never
assigns (a break the harness's own construction of the object would hide), asked once per target through
its `Target.contract_breaks()` (its default: none)."""

from __future__ import annotations

from harness.findings import Finding
from harness.oracles.registry import Judged, oracle


def _has_a_source_check(judged: Judged) -> bool:
    return judged.target is not None and judged.selects("contract")


@oracle("contract", "an attribute the target's source reads but never assigns", applies=_has_a_source_check)
def contract_oracle(judged: Judged) -> list[Finding]:
    return [Finding("contract", "never-assigned", f"{b} (static check of the installed source, as "
                                                   f"`python -m harness triage --static-only` runs it)")
            for b in judged.target.contract_breaks()]
