"""`execution`: a run that raised (with a full barrier; under overlap only, filed as `differential`), and a
planned mutation that never ran (the case did not test what it says)."""

from __future__ import annotations

from harness.findings import Finding
from harness.oracles.registry import Judged, oracle


@oracle("execution", "a run that raised, and a planned mutation that never ran")
def execution_oracle(judged: Judged) -> list[Finding]:
    case, overlapped, barriered = judged.case, judged.overlapped, judged.barriered
    out = []
    if barriered.crash:
        batch, message = barriered.crash
        out.append(Finding("execution", "target-raised", f"the target raised even with a full barrier: {message}", batch))
    elif overlapped.crash:
        batch, message = overlapped.crash
        out.append(Finding("differential", "crash-under-overlap",
                           f"the overlapped run raised, the barriered run did not: {message}", batch))
    for index, batch in enumerate(case.batches[: len(overlapped.applied)]):
        if batch.mutations and not overlapped.applied[index] and not overlapped.crash:
            out.append(Finding("execution", "mutation-never-ran",
                               f"batch {index} planned {[m.kind for m in batch.mutations]} but no mutation ran", index))
    return out
