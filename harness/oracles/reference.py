"""`reference`: for a target that is not the model (the real SGLang code), its chunk cache, publish decision,
declarations and attention against the model's on the same case, asked through the target's
`Target.reference_differences(case, device_name)` (its default, the model's own: no differences)."""

from __future__ import annotations

import re

from harness.case import Case
from harness.errors import HarnessError
from harness.findings import Finding, refuse_out_of_memory
from harness.oracles.registry import Judged, oracle


def _asks_the_model(judged: Judged) -> bool:
    return judged.target is not None and judged.barriered.crash is None and judged.selects("reference")


@oracle("reference", "a target that is not the model differs from the model on the same case", applies=_asks_the_model)
def reference_check(judged: Judged) -> list[Finding]:
    return reference_oracle(judged.target, judged.case, judged.device_name)


def reference_oracle(target, case: Case, device_name: str) -> list[Finding]:
    """A target that is not the reference model (the real SGLang code) against the model, field by field,
    on the same case with nothing mutating the tables: a regression that is no race (a gate, a threshold,
    a declaration) shows here even though both of the target's own runs agree."""
    try:
        diffs = target.reference_differences(case, device_name)
    except HarnessError:
        raise
    except Exception as exc:  # the target raised on the host: a finding, never a harness traceback
        refuse_out_of_memory(exc)
        return [Finding("reference", "target-raised", f"comparing with the reference model, the target raised "
                                                      f"{type(exc).__name__}: {exc}")]
    return [Finding("reference", "reference-mismatch", f"the real code and the reference model differ in {name}: {why}",
                    int(m.group(1)) if (m := re.match(r"batch (\d+):", why)) else 0)
            for name, why in diffs.items()]
