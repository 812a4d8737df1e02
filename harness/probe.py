"""What a target reports about its own decisions: the probe and its typed records.

A session owns one `Probe`; the target's code calls `probe.note(record)` where it decides something the
harness cannot see from the tensors alone (it published the read-done event, it built the snapshot, it
fell back to the live tables), and the engine takes the batch's records after each step
(`RunRecord.notes`, one list per batch, in the order they were noted). Oracles read them by type: the
`policy` oracle checks them against each other and against the design's publication rule, the `sglang`
target's comparison with the model compares them field by field, the second opinion counts the replays.

A target that does not note a record the oracles expect is judged as if it had not made the decision:
a target that never notes `Publish` gets a "missed fast path" wherever the design says it should
publish. The records are the protocol of `harness.targets.protocol` (which re-exports them); they are
declared here, on the bottom floor, because the reference model (`harness.model`, a floor below the
targets) notes them too.

Modelled on CSAN's `Access` record (torch/cuda/_sanitizer.py): a frozen dataclass per kind of event
instead of a ("kind", {...}) tuple with ad-hoc keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import ClassVar, Optional, TypeVar


@dataclass(frozen=True)
class ProbeRecord:
    """One decision of the target, noted while a batch ran."""

    name: ClassVar[str] = "record"
    """The record's name in a finding's message (for example "lazy_build")."""


@dataclass(frozen=True)
class Dispatch(ProbeRecord):
    """The model runner took the batch and dispatched it by its forward mode (noted once per batch, first)."""

    name: ClassVar[str] = "batch"

    mode: str
    """The batch's forward mode, by name (`EXTEND`, `DECODE`, `TARGET_VERIFY`, `MIXED`, `IDLE`, ...)."""
    tokens: int
    """The batch's live query tokens (before any padding to a graph bucket)."""


@dataclass(frozen=True)
class Snapshot(ProbeRecord):
    """The backend resolved the batch's prefill shared reads as ending before the replay (PRE_REPLAY), and
    so took its snapshot: the sparse chunk cache the forward reads instead of the live tables. Noted when
    the decision is made, before the build runs."""

    name: ClassVar[str] = "snapshot"

    num_qo_tokens: int
    """The query rows the snapshot is built for (under a graph replay: the padded bucket's rows)."""
    sparse: bool
    """Whether the snapshot uses sparse prefill, so builds the chunk cache (False: a dense snapshot, nothing
    to build)."""


@dataclass(frozen=True)
class Forward(ProbeRecord):
    """The attention forward ran over the batch."""

    name: ClassVar[str] = "forward"

    rows: int
    """The query rows the forward ran (the padded bucket's under a graph replay)."""
    sparse: bool
    """Whether the forward took the sparse prefill path (it must agree with the snapshot's decision)."""


@dataclass(frozen=True)
class Publish(ProbeRecord):
    """The runner recorded the read-done event and published it to the scheduler (the fast path): from here
    the scheduler may rewrite the tables the forward read, without the coarse barrier."""

    name: ClassVar[str] = "publish"

    stream: str
    """The stream the event was recorded on, by name ("forward" is right; a target whose event has no
    stream notes what it had instead, e.g. "none (Event)")."""
    event: Optional[int]
    """The recorded event's id on the device (None when nothing was recorded)."""


@dataclass(frozen=True)
class LazyBuild(ProbeRecord):
    """A layer found no chunk cache and built it from the live tables while the forward ran (after the
    event, when the batch published: a read the scheduler may already have overwritten)."""

    name: ClassVar[str] = "lazy_build"

    layer: int
    """The layer that built it."""


@dataclass(frozen=True)
class SwaLocFallback(ProbeRecord):
    """`get_swa_out_cache_loc` re-translated the output locations through the live full-to-SWA table
    instead of the snapshot's copy (after the event, when the batch published: a read of a table the
    scheduler may rewrite)."""

    name: ClassVar[str] = "swa_loc_fallback"


@dataclass(frozen=True)
class GraphReplay(ProbeRecord):
    """The prefill graph runner replayed a captured graph for the batch."""

    name: ClassVar[str] = "graph_replay"

    bucket: int
    """The captured bucket (query rows) the batch was padded to."""
    tokens: int
    """The batch's live query tokens."""
    stale_padded_rows: int = 0
    """How many of the bucket's padded rows the runner handed the replay with an input id, a position or an output
    slot other than 0, what SGLang's prefill registry pads them with (`PaddingPolicy.ZERO`: the dummy slot 0): such a
    row holds what an earlier step left there, and its store lands in that step's KV slot."""


@dataclass(frozen=True)
class DraftGraphReplay(ProbeRecord):
    """EAGLE's draft-extend graph runner replayed a captured batch size for the batch's draft extend."""

    name: ClassVar[str] = "draft_graph_replay"

    bucket: int
    """The captured batch size (requests) the draft extend was padded to."""
    requests: int
    """The draft extend's live requests."""
    stale_padded_requests: int = 0
    """How many of the bucket's padded requests the runner planned with anything but what SGLang's `execute` pads
    them with (every release): request-pool row 0, the reserved row whose `req_to_token` entries stay 0; the
    sequence-length fill value; output slot and position 0 for each of its tokens. Such a request holds what a
    larger draft extend before left there, and the metadata plan reads that request's row of `req_to_token`, which
    the scheduler may be rewriting."""


@dataclass(frozen=True)
class MetadataReuse(ProbeRecord):
    """A graph replay reused the bucket's captured metadata; what it still held from the earlier replay."""

    name: ClassVar[str] = "metadata_reuse"

    cache_reset: bool
    """Whether the captured metadata's sparse prefill cache was reset (None) before this replay."""
    flag_reset: bool
    """Whether its `prefill_shared_reads_snapshotted` flag was reset before this replay (PR-era; always
    True where the metadata has no such flag)."""


class PlanKind(Enum):
    """What a forward reads that was planned for its batch before the layers ran."""

    METADATA = "attention metadata"
    CHUNK_CACHE = "sparse prefill chunk cache"


@dataclass(frozen=True)
class Planned(ProbeRecord):
    """The target planned one of a forward's inputs for the batch in flight: built its attention metadata, refilled
    a captured bucket's metadata in place for a replay, or built the chunk cache. `plan` names this planning."""

    name: ClassVar[str] = "planned"

    kind: PlanKind
    plan: int
    """A number the target gives each planning, never reused within a session (an object's identity is not enough:
    a bucket's captured metadata is one object refilled by every replay)."""


@dataclass(frozen=True)
class PlanRead(ProbeRecord):
    """A forward read a planned input (an idle step's forward too: it runs with whatever the backend holds)."""

    name: ClassVar[str] = "plan_read"

    kind: PlanKind
    plan: Optional[int]
    """The `Planned.plan` of what it read; None when it read nothing planned (an idle step without rows, whose
    metadata was dropped) or what it read carries no plan number."""


R = TypeVar("R", bound=ProbeRecord)


def first(records: list[ProbeRecord], kind: type[R]) -> Optional[R]:
    """The first record of type `kind` among one batch's records, or None."""
    return next((r for r in records if isinstance(r, kind)), None)


def noted(records: list[ProbeRecord], kind: type[ProbeRecord]) -> bool:
    """Whether one batch's records hold one of type `kind`."""
    return first(records, kind) is not None


@dataclass
class Probe:
    """Where a session's code notes its decisions; the engine takes them after each batch."""

    records: list[ProbeRecord] = field(default_factory=list)

    def note(self, record: ProbeRecord) -> None:
        self.records.append(record)

    def take(self) -> list[ProbeRecord]:
        """The records noted since the last take, in order; the probe is empty afterwards."""
        records, self.records = self.records, []
        return records
