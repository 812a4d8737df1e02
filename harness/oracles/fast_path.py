"""`fast-path`: on a batch that publishes as the design says, the read-done event sits where it lets the
scheduler overlap the forward, and the scheduler's barrier waits on it and on nothing later.

No value differs and no race exists when the fast path is lost this way; the tracker's timeline shows it
(`harness.hb.TimelineEntry`, one list per batch): the record of the published event, with the forward
stream's clock it copied; the launches in issue order, with the buffers they declared; and the clock of the
scheduler's stream where it starts on the batch's result (the engine's checkpoint). Three ways to lose it:

- the event is recorded after the layers began: a launch that touches a KV pool (every layer stores its KV
  before it attends) precedes the record in the forward stream's order, so the event fires with the forward;
- the scheduler waits past the event: its stream is ordered after forward work that follows the record (a
  barrier that waits on the whole forward stream after a publish, or on a later event);
- the scheduler does not wait on it at all: its stream is not ordered after the record (a barrier that
  ignores the event). Then nothing orders the mutations behind the forward's reads either, so it is filed
  as a correctness finding, `unawaited-event`, where the other two are `missed-fast-path`.

Only batches where the design says to publish (`harness.policy.expected_publish`) and the target did, with an
event recorded on the forward stream in this batch, are judged, and none under `SGLANG_FORCE_COARSE_WAR_BARRIER`
(the PR-era releases record the event there, and the scheduler waits for the whole forward, as asked): a publish the design forbids, a missing one
and an event on the wrong stream are the `policy` oracle's.
"""

from __future__ import annotations

from harness.findings import Finding, RunRecord
from harness.hb import Checkpoint, Issued, Recorded, TimelineEntry
from harness.oracles.registry import Judged, oracle
from harness.policy import expected_publish
from harness.targets.protocol import Publish, first

KV_POOLS = ("swa_kv", "extra_kv", "indexer_k")
"""The KV stores by the protocol's names (`Session.kv_state`); a 3-D pool is declared per layer as
`name[layer]`. The first launch that touches one of them is where a layer's work begins."""


@oracle("fast-path", "a publishing batch whose event is recorded after the layers begin, or whose scheduler "
        "waits past the event or not on it")
def fast_path_oracle(judged: Judged) -> list[Finding]:
    case, run = judged.case, judged.overlapped
    if case.flags.SGLANG_FORCE_COARSE_WAR_BARRIER:
        return []  # the coarse barrier by configuration (PR-era releases still record the event under it)
    out = []
    for index, (notes, timeline) in enumerate(zip(run.notes, run.timeline)):
        publish = first(notes, Publish)
        if (publish is None or publish.event is None or (run.crash and run.crash[0] == index)
                or not expected_publish(case, case.batches[index])[0]):
            continue
        out += _judge_batch(index, publish.event, timeline, run)
    return out


def _judge_batch(index: int, event: int, timeline: list[TimelineEntry], run: RunRecord) -> list[Finding]:
    forward = run.forward_stream
    record = _last_record(timeline, event)
    if record is None or record.stream != forward:
        return []  # recorded by an earlier batch, or on another stream: the policy oracle's
    at = record.clock.get(forward, 0)
    out = []
    layers = next((e for e in timeline if isinstance(e, Issued) and e.stream == forward and _touches_kv(e)), None)
    if layers is not None and layers.seq <= at:
        out.append(_missed(index, "event-after-layers",
                           f"batch {index}: the read-done event was recorded after {layers.op!r} (seq {layers.seq}) "
                           f"touched the KV pool: it fires with the forward, so the scheduler cannot overlap it",
                           layers.op))
    scheduler = next((e for e in timeline if isinstance(e, Checkpoint) and e.stream != forward), None)
    if scheduler is None:
        out.append(Finding("fast-path", "scheduler-never-ran",
                           f"batch {index} published, but the scheduler never started on its result: its barrier "
                           "cannot be judged", index))
        return out
    waited = scheduler.clock.get(forward, 0)
    if waited < at:
        out.append(Finding("fast-path", "unawaited-event",
                           f"batch {index}: the scheduler starts on the result without waiting for the published "
                           f"read-done event (its stream knows the forward stream up to seq {waited}, the event "
                           f"was recorded at seq {at}): nothing orders its mutations behind the forward's reads",
                           index, details={"cause": "event-not-awaited", "event_seq": at, "waited_seq": waited}))
    elif waited > at:
        past = _last_forward_launch(timeline, forward, waited)
        out.append(_missed(index, "barrier-waits-past-event",
                           f"batch {index}: the scheduler's barrier waits for forward work after the published "
                           f"event (up to {past!r}, seq {waited}; the event was recorded at seq {at}): it waits "
                           "for the whole forward, as the coarse barrier does", past,
                           event_seq=at, waited_seq=waited))
    return out


def _missed(index: int, cause: str, message: str, op: str | None, **seqs: int) -> Finding:
    return Finding("fast-path", "missed-fast-path", message, index, severity="performance",
                   details={"cause": cause, "ops": [op] if op else [], **seqs})


def _last_record(timeline: list[TimelineEntry], event: int) -> Recorded | None:
    """The batch's last record of `event` (a wait binds to the latest record, as CUDA's does)."""
    return next((e for e in reversed(timeline) if isinstance(e, Recorded) and e.event == event), None)


def _touches_kv(launch: Issued) -> bool:
    return any(buffer.split("[", 1)[0] in KV_POOLS for buffer in launch.buffers)


def _last_forward_launch(timeline: list[TimelineEntry], forward: int, seq: int) -> str | None:
    """The last forward-stream launch at or before `seq`: the work the scheduler waited for."""
    launch = next((e for e in reversed(timeline) if isinstance(e, Issued) and e.stream == forward and e.seq <= seq),
                  None)
    return launch.op if launch is not None else None
