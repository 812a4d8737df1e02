"""`happens-before`: no unordered conflicting access pair in the overlapped run's program, declared or
observed; and no observed access to a shared buffer that its operation did not declare."""

from __future__ import annotations

from harness.findings import Finding, RunRecord
from harness.oracles.registry import Judged, oracle


@oracle("happens-before", "an unordered conflicting access pair, or an access its operation did not declare")
def happens_before_oracle(judged: Judged) -> list[Finding]:
    return hb_oracle(judged.overlapped)


def hb_oracle(run: RunRecord) -> list[Finding]:
    """Unordered conflicting pairs, declared or observed; and every observed access to a shared buffer
    that its operation did not declare (one finding per op, buffer and kind)."""
    findings = [Finding("happens-before", "unordered-access", str(c),
                        details={"buffer": c.earlier.buffer, "ops": [c.earlier.op, c.later.op],
                                 "frames": [c.earlier.frame, c.later.frame]})
                for c in run.conflicts]
    seen = set()
    for access in run.undeclared:
        key = (access.op, access.buffer, access.is_write)
        if key not in seen:
            seen.add(key)
            findings.append(Finding("happens-before", "undeclared-access", str(access),
                                    details={"buffer": access.buffer, "ops": [access.op], "frames": [access.frame]}))
    return findings
