"""`freshness`: what a forward reads of its planned inputs (the attention metadata, the sparse prefill chunk
cache) was planned for that forward's batch, not kept from an earlier step.

A kept plan can hold the same values as a fresh one (the same geometry again), and then no value differs; it
can also hold tables an earlier step's scheduler has since rewritten (SGLang's idle step drops its metadata for
that reason: an SWA use-after-free otherwise). So the check is one of identity, against the batch's own plans:
the target notes each planning (`Planned`, a number never reused in its session: a fresh metadata object, a
captured bucket's metadata refilled for a replay, a chunk cache built) and each read (`PlanRead`, the number
of what it read); every read plan must have been planned earlier in the same batch. This holds across idle
steps (which must read nothing planned), refused replays (the eager path plans afresh), bucket changes (each
bucket's captured metadata is refilled, its cache reset) and speculative steps.

The same holds for a graph replay's padded rows: SGLang's prefill registry pads them afresh every replay (input
id, position and output slot 0, the dummy slot), and a padded row that still holds an earlier step's slot stores its
latent into that step's KV (`GraphReplay.stale_padded_rows`, which the sglang target counts in the static batch SGLang's
`load_batch` made). EAGLE's draft-extend graph pads by request: SGLang's `execute` points a padded request at the
reserved request-pool row 0 with the sequence-length fill value and output slot and position 0 for its tokens, and
one that still holds a larger draft extend's request has the metadata plan read that request's row of
`req_to_token` (`DraftGraphReplay.stale_padded_requests`).

A read of something without a plan number (`PlanRead.plan` None outside an idle step) is not judged: a target
that does not number its plans is judged by the other oracles. The sglang target numbers SGLang's own objects by
identity (`harness.sglang_target.plans`).
"""

from __future__ import annotations

from harness.findings import Finding
from harness.oracles.registry import Judged, oracle
from harness.targets.protocol import DraftGraphReplay, GraphReplay, Planned, PlanRead


@oracle("freshness", "a forward read metadata, a chunk cache or padded rows planned for another batch")
def freshness_oracle(judged: Judged) -> list[Finding]:
    run, batches = judged.overlapped, judged.case.batches
    planned_in: dict[tuple, int] = {}  # (kind, plan) -> the batch that planned it
    out = []
    for index, notes in enumerate(run.notes):
        own: set[tuple] = set()
        for record in notes:
            if isinstance(record, Planned):
                own.add((record.kind, record.plan))
                planned_in[(record.kind, record.plan)] = index
            elif isinstance(record, PlanRead) and record.plan is not None and (record.kind, record.plan) not in own:
                own.add((record.kind, record.plan))  # reported once per batch and plan
                origin = planned_in.get((record.kind, record.plan))
                where = f"batch {origin}" if origin is not None else "no step before the read"
                out.append(Finding("freshness", "stale-plan",
                                   f"batch {index} ({batches[index].mode.name}) read {record.kind.value} planned for "
                                   f"{where}, not for itself (plan {record.plan})", index,
                                   details={"plan": record.kind.value, "planned_in": origin}))
            elif isinstance(record, GraphReplay) and record.stale_padded_rows:
                out.append(Finding("freshness", "stale-padding",
                                   f"batch {index} ({batches[index].mode.name}) replayed bucket {record.bucket} with "
                                   f"{record.stale_padded_rows} of its {record.bucket - record.tokens} padded rows "
                                   f"holding an earlier step's input id, position or output slot, not 0 (the dummy "
                                   f"slot)", index, details={"bucket": record.bucket, "tokens": record.tokens}))
            elif isinstance(record, DraftGraphReplay) and record.stale_padded_requests:
                out.append(Finding("freshness", "stale-padding",
                                   f"batch {index} ({batches[index].mode.name}) replayed the draft-extend graph's "
                                   f"batch size {record.bucket} with {record.stale_padded_requests} of its "
                                   f"{record.bucket - record.requests} padded requests holding an earlier draft "
                                   f"extend's request-pool row, sequence length, output slot or position, not the "
                                   f"reserved row 0 (whose req_to_token entries stay 0) and the fill values", index,
                                   details={"bucket": record.bucket, "requests": record.requests}))
    return out
