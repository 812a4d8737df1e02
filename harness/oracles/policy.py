"""`policy`: publication as the design says (`harness.policy`), and the target's own decisions (its probe
records, `harness.targets.protocol`) consistent with each other."""

from __future__ import annotations

from harness.case import Case
from harness.findings import Finding
from harness.oracles.registry import Judged, oracle
from harness.policy import expected_publish, runs_graph
from harness.targets.protocol import (Forward, LazyBuild, MetadataReuse, ProbeRecord, Publish, Snapshot, SwaLocFallback,
                                      first, noted)


@oracle("policy", "publication not as the design says, or the target's own decisions inconsistent")
def policy_oracle(judged: Judged) -> list[Finding]:
    case, run = judged.case, judged.overlapped
    out = []
    for index, notes in enumerate(run.notes):
        batch = case.batches[index]
        published = noted(notes, Publish)
        if run.crash and run.crash[0] == index and not published:
            continue
        want, rule = expected_publish(case, batch)
        if published and not want:
            out.append(Finding("policy", "unexpected-publish", f"batch {index} published although {rule}", index))
        elif want and not published:
            out.append(Finding("policy", "missed-fast-path",
                               f"batch {index} should publish ({rule}) but did not: the scheduler falls back to "
                               "the coarse barrier", index, severity="performance"))
        out += _decision_checks(case, index, notes, published)
    return out


def _decision_checks(case: Case, index: int, notes: list[ProbeRecord], published: bool) -> list[Finding]:
    out = []
    batch = case.batches[index]
    for record in notes:
        if isinstance(record, MetadataReuse) and not (record.cache_reset and record.flag_reset):
            out.append(Finding("policy", "metadata-not-reset",
                               f"batch {index}: reused graph metadata kept {'the sparse cache' if not record.cache_reset else 'the snapshotted flag'}"
                               " from an earlier replay", index))
        if isinstance(record, Publish) and record.stream != "forward":
            out.append(Finding("policy", "event-on-wrong-stream",
                               f"batch {index}: the read-done event was recorded on the {record.stream} stream", index))
    if not published:
        return out
    snap, fwd = first(notes, Snapshot), first(notes, Forward)
    if snap is None:
        out.append(Finding("policy", "publish-without-snapshot",
                           f"batch {index} published but the backend never built its snapshot", index))
        return out
    if fwd is not None and snap.sparse != fwd.sparse:
        out.append(Finding("policy", "sparse-decision-disagrees",
                           f"batch {index}: the snapshot decided {'sparse' if snap.sparse else 'dense'} at "
                           f"{snap.num_qo_tokens} tokens, the forward {'sparse' if fwd.sparse else 'dense'} "
                           f"at {fwd.rows} rows", index))
    if fwd is not None and snap.num_qo_tokens != fwd.rows:
        out.append(Finding("policy", "snapshot-geometry",
                           f"batch {index}: snapshot built for {snap.num_qo_tokens} query rows, the forward runs "
                           f"{fwd.rows}" + (" (graph replay must snapshot at the padded bucket)" if runs_graph(case, batch) else ""),
                           index))
    for record in notes:
        if isinstance(record, (LazyBuild, SwaLocFallback)):
            out.append(Finding("policy", "read-after-publish",
                               f"batch {index}: {record.name.replace('_', ' ')} read the live tables after the event was published",
                               index))
    return out
