"""The protocol's shapes a campaign reached, batch by batch, and the ones it never reached.

A shape is one value per dimension: forward mode, speculative algorithm, eager / first graph replay
/ reused bucket, the mode as the runner that ran it (eager or graph replay), the graph contract of a
replay, the expected publish decision, the gate that closes it, a mutation kind, sparse or dense,
where the token count sits against a graph bucket or the sparse threshold, and whether a replay follows a sparse
replay of its bucket (the chunk cache its captured metadata may keep). The full product has
millions of shapes, most of which no batch can have (an IDLE batch has no tokens to be sparse), so
the table is factored: one count per value of each dimension, plus the number of distinct
combinations reached. A value with count 0 is listed as never reached, or, where the campaign cannot
draw it at all (a gate its target cannot run), as unreachable with the reason. Each value also keeps
the place in the case stream of the first case that reached it, which shows how soon a campaign
covers the table (the coverage-first phase, `harness.covering`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping, NamedTuple, Optional

from harness.case import GRAPH_CONTRACTS, MUTATION_KINDS, Case
from harness.model.enums import ForwardMode, SpeculativeAlgorithm
from harness.model.metadata import LARGE_INDEXER_QUERY_THRESHOLD
from harness.model.runners import generate_prefill_cuda_graph_batch_sizes, generate_speculative_cuda_graph_batch_sizes
from harness.policy import GRAPH_MAX_BS, expected_publish, graph_bucket, runs_graph

GRAPH_PHASES = ("eager", "first graph replay", "reused bucket")
GATES = ("open", "READ_DONE off", "coarse barrier", "cp_active", "hisparse", "hierarchical_cache",
         "hicache_storage", "lmcache")
# the edges a token count can sit at: its offset from the sparse threshold, or from a prefill-graph bucket
THRESHOLD_EDGES = {0: "threshold", 1: "threshold+1", -1: "threshold-1"}
BUCKET_EDGES = {0: "bucket", 1: "bucket+1", -1: "bucket-1"}
EDGES = ("bucket-1", "bucket", "bucket+1", "threshold-1", "threshold", "threshold+1", "no edge")
TOKEN_DECADES = ("1-9", "10-99", "100-999", "1000-9999", "10000+")
# Every mode through both runners (an IDLE batch never replays): a draft or verify batch replayed by the graph
# runner takes another path through the backend than one the eager runner runs.
RUNNERS = tuple((mode, graph) for mode in ForwardMode for graph in (False, True)
                if not (graph and mode is ForwardMode.IDLE))


def runner(mode: ForwardMode, graph: bool) -> str:
    return f"{mode.name} {'graph' if graph else 'eager'}"


# What a replay's captured metadata may still hold from its bucket's last replay, where that one was sparse (it built
# the chunk cache): replayed just before, or with another bucket replayed between; under each graph contract, as
# the captured metadata is made current by another method under each (copy_, refresh_for_breakable_cuda_graph_replay_).
# A replay that does not reset what the captured metadata kept reads that earlier batch's cache.
CARRY_ORDERS = ("after its bucket's sparse replay", "after another bucket's replay")


def carry(contract: str, order: str) -> str:
    return f"{contract}: {order}"


CARRIES = tuple(carry(contract, order) for contract in GRAPH_CONTRACTS for order in CARRY_ORDERS)

# What a batch finds that the step before left behind, where only that step's kind makes it matter:
# - a replay of more live rows: its padded rows' positions in the static buffers (positions, out_cache_loc, the
#   model's inputs) still hold that batch's values unless `load_batch` pads them afresh (query position 0, the
#   dummy slot 0), and a padded row then writes its latent into that batch's KV slot. The modes the prefill graph
#   runner replays (SGLang's refuses target-verify; decode graphs are another runner's), whichever the bucket;
# - a publishing batch, where this one publishes nothing: the event of that one is still in the runner's mailbox
#   unless the scheduler's barrier cleared it, and a barrier that waits on it again waits for nothing;
# - a batch with requests, where this one is an idle step: that batch's metadata is still the backend's unless the
#   idle step drops it, and its tables may since have been rewritten (SGLang's idle runner drops it for that reason);
# - a draft-extend replay of more requests, where this one's request count pads to a bucket: its padded requests'
#   request-pool rows in the static buffer still name that batch's requests unless the runner points them at the
#   reserved row 0, and the metadata plan then reads rows of requests this batch does not own, which the scheduler
#   may be rewriting. EAGLE's family extends its draft over a verify (and a draft-extend batch, which stands for that
#   step) at one draft width; its draft-extend graph pads by request count (`generate_speculative_cuda_graph_
#   batch_sizes`: every count to 8, then every other one).
FOLLOWS_LARGER_REPLAY = "a replay of more live rows, padding over them"
FOLLOWS_PUBLISH = "a publishing batch, publishing nothing"
FOLLOWS_PLANNED = "a batch with requests, idle"
FOLLOWS_LARGER_DRAFT_REPLAY = "a draft-extend replay of more requests, padding over them"
_PREFILL_REPLAYS = (ForwardMode.EXTEND, ForwardMode.MIXED)
_DRAFT_BUCKETS = frozenset(generate_speculative_cuda_graph_batch_sizes(GRAPH_MAX_BS))

# How a HiSparse prefill batch reads the c4 cache, which HiSparse keeps at device slots of its own (a smaller pool,
# handed out from its own free list, so a device slot is not the logical one): the sparse prefill through its chunk
# cache, gathered from the page table; the dense prefill through the indexer's top-k, translated to device slots.
# Only a batch that has a c4 block to read reaches either: a ratio-4 layer, a request of 4 tokens or more.
HISPARSE_READS = ("sparse prefill", "dense prefill")
C4_RATIO = 4


DIMENSIONS = {
    "mode": tuple(m.name for m in ForwardMode),
    "spec": tuple(s.name for s in SpeculativeAlgorithm),
    "graph": GRAPH_PHASES,
    "runner": tuple(runner(mode, graph) for mode, graph in RUNNERS),
    "contract": GRAPH_CONTRACTS,  # of a batch the graph runner replays
    "publish": ("publish", "no publish"),
    "gate": GATES,
    "mutation": MUTATION_KINDS,
    "attention": ("sparse", "dense"),
    "edge": EDGES,
    "tokens": TOKEN_DECADES,
    "carry": CARRIES,
    "follows": (FOLLOWS_LARGER_REPLAY, FOLLOWS_PUBLISH, FOLLOWS_PLANNED, FOLLOWS_LARGER_DRAFT_REPLAY),
    "hisparse c4 read": HISPARSE_READS,
}
_BUCKETS = frozenset(generate_prefill_cuda_graph_batch_sizes(GRAPH_MAX_BS))


class Value(NamedTuple):
    """One value of one dimension of the table."""

    dimension: str
    value: str

    def __str__(self) -> str:
        return f"{self.dimension} {self.value}"


VALUES = tuple(Value(name, value) for name, values in DIMENSIONS.items() for value in values)


def full_product_size() -> int:
    size = 1
    for values in DIMENSIONS.values():
        size *= len(values)
    return size


def gate(case: Case) -> str:
    """The first gate that closes publication for the case's flags ("open" when none does)."""
    f, sem = case.flags, case.semantics
    if not f.prefill_read_done_enabled(sem):
        return "READ_DONE off"
    if f.SGLANG_FORCE_COARSE_WAR_BARRIER:
        return "coarse barrier"
    for name in ("cp_active", "hisparse", "hierarchical_cache", "hicache_storage", "lmcache"):
        if getattr(f, name):
            return name
    return "open"


def edge(num_tokens: int) -> str:
    """Where a token count sits: at a prefill-graph bucket (or one off it), or at the sparse threshold."""
    for offset, name in THRESHOLD_EDGES.items():
        if num_tokens == LARGE_INDEXER_QUERY_THRESHOLD + offset:
            return name
    for offset, name in BUCKET_EDGES.items():
        if num_tokens - offset in _BUCKETS:
            return name
    return "no edge"


def decade(num_tokens: int) -> str:
    return TOKEN_DECADES[min(len(str(max(num_tokens, 1))) - 1, len(TOKEN_DECADES) - 1)]


def holds_c4_block(requests) -> bool:
    """Whether one of `requests` is a c4 block long or more (has a compressed c4 entry to read)."""
    return any(r.seq_len >= C4_RATIO for r in requests)


def reads_c4_blocks(case: Case, batch) -> bool:
    """Whether a prefill batch of `case` has a c4 block to read: a ratio-4 layer, a request of a block or more."""
    return batch.mode in _PREFILL_REPLAYS and C4_RATIO in case.dims.layer_ratios and holds_c4_block(batch.requests)


def replays_draft_extend(case: Case, batch) -> bool:
    """Whether the draft extend after `batch` is a replay of EAGLE's draft-extend graph: a verify or draft-extend
    batch replayed, of an EAGLE-family case, its requests at one draft width."""
    return (batch.graph and batch.mode.is_draft_wide() and case.spec.is_eagle_family()
            and len({r.extend_len for r in batch.requests}) == 1)


def batch_shapes(case: Case) -> list[dict[str, str]]:
    """One shape per (batch, mutation kind) of the case; a batch without mutations has none."""
    shapes, replayed, sparse_replay, last_bucket = [], set(), {}, None
    last_live, published, planned = None, False, False  # what the batch before left behind (`follows`)
    most_drafted = 0  # the most requests a draft-extend replay before had (its rows in the static buffer)
    for batch in case.batches:
        graph = runs_graph(case, batch)
        bucket = graph_bucket(batch.num_tokens) if graph else None
        phase = "eager" if not graph else "reused bucket" if bucket in replayed else "first graph replay"
        if graph:
            replayed.add(bucket)
        rows = bucket if graph else batch.num_tokens
        sparse = batch.mode is ForwardMode.EXTEND and (
            rows > LARGE_INDEXER_QUERY_THRESHOLD or case.flags.SGLANG_OPT_FLASHMLA_SPARSE_PREFILL)
        carried = ""
        if graph:
            if sparse_replay.get(bucket):
                carried = carry(case.graph_contract, CARRY_ORDERS[bucket != last_bucket])
            sparse_replay[bucket], last_bucket = sparse, bucket
        publishes = expected_publish(case, batch)[0]
        follows = FOLLOWS_PUBLISH if published and not publishes else ""
        if batch.mode is ForwardMode.IDLE and planned:
            follows = FOLLOWS_PLANNED
        planned = bool(batch.requests)
        if graph and batch.mode in _PREFILL_REPLAYS:
            if last_live is not None and batch.num_tokens < min(last_live, bucket):
                follows = FOLLOWS_LARGER_REPLAY
            last_live = batch.num_tokens
        if replays_draft_extend(case, batch):
            if len(batch.requests) not in _DRAFT_BUCKETS and len(batch.requests) < most_drafted:
                follows = FOLLOWS_LARGER_DRAFT_REPLAY
            most_drafted = max(most_drafted, len(batch.requests))
        published = publishes
        common = {"mode": batch.mode.name, "spec": case.spec.name, "graph": phase,
                  "runner": runner(batch.mode, graph), "contract": case.graph_contract if graph else "",
                  "publish": "publish" if publishes else "no publish", "gate": gate(case),
                  "attention": "sparse" if sparse else "dense", "edge": edge(batch.num_tokens),
                  "tokens": decade(batch.num_tokens) if batch.requests else "", "carry": carried,
                  "follows": follows,
                  "hisparse c4 read": HISPARSE_READS[not sparse]
                  if case.flags.hisparse and reads_c4_blocks(case, batch) else ""}
        for kind in dict.fromkeys(m.kind for m in batch.mutations) or ("",):
            shapes.append({**common, "mutation": kind})
    return shapes


def values(case: Case) -> set[Value]:
    """Every value the case's batches reach: a function of the case alone, so it is known once the case is drawn."""
    return {Value(name, value) for shape in batch_shapes(case) for name, value in shape.items() if value}


@dataclass
class Coverage:
    """`unreachable`: the values the campaign cannot draw, with the reason (`covering.unreachable`)."""

    unreachable: Mapping[Value, str] = field(default_factory=dict)
    counts: dict[str, Counter] = field(default_factory=lambda: {d: Counter() for d in DIMENSIONS})
    combinations: Counter = field(default_factory=Counter)
    first_reached: dict[Value, int] = field(default_factory=dict)  # value -> 1-based place in the case stream

    def add(self, case: Case, position: Optional[int] = None) -> None:
        """`position`: the case's place in the case stream, 0 first; None for a failure replayed from the example
        database, which runs before the stream (it counts, but reaches nothing first). Cases are added in
        stream order, so the first place kept is the smallest."""
        for shape in batch_shapes(case):
            for name, value in shape.items():
                if value:
                    self.counts[name][value] += 1
            self.combinations[tuple(shape[d] for d in DIMENSIONS)] += 1
        if position is not None:
            for value in values(case):
                self.first_reached.setdefault(value, position + 1)

    def to_dict(self) -> dict:
        return {**_table(self.counts, self.first_reached, self.unreachable),
                "combinations_reached": len(self.combinations)}


def _table(counts: Mapping[str, Counter], first_reached: Mapping[Value, int], unreachable: Mapping[Value, str]) -> dict:
    """The table's figures: a value never reached is `unreachable` (with the reason) where the campaign cannot
    draw it, else `unreached`; `reached_by`: the place in the stream by which every other value was reached
    (None while one is unreached)."""
    never = [v for v in VALUES if not counts[v.dimension][v.value]]
    unreached = [v for v in never if v not in unreachable]
    impossible = [v for v in never if v in unreachable]
    return {
        "factored": True,
        "full_product": full_product_size(),
        "dimensions": {name: {value: counts[name][value] for value in values} for name, values in DIMENSIONS.items()},
        "first_reached": {name: {value: first_reached.get(Value(name, value)) for value in values}
                          for name, values in DIMENSIONS.items()},
        "unreached": {name: [v.value for v in unreached if v.dimension == name]
                      for name in dict.fromkeys(v.dimension for v in unreached)},
        "unreachable": {name: {v.value: unreachable[v] for v in impossible if v.dimension == name}
                        for name in dict.fromkeys(v.dimension for v in impossible)},
        "reached_by": None if unreached else max(first_reached.values(), default=None),
    }


def merge_tables(tables: list[dict]) -> dict:
    """The coverage of several parts of one campaign (shards, workers): counts add up, and a value was first
    reached at the smallest place any part reached it (the parts number the same case stream). Their distinct
    combinations cannot be united from counts alone, so the merged figure is the largest part's, a lower
    bound, and says so."""
    counts = {name: Counter() for name in DIMENSIONS}
    first: dict[Value, int] = {}
    unreachable: dict[Value, str] = {}
    for table in tables:
        for name, values in table["dimensions"].items():
            counts.setdefault(name, Counter()).update(values)
        for name, places in table.get("first_reached", {}).items():
            for value, place in places.items():
                if place is not None:
                    first[Value(name, value)] = min(place, first.get(Value(name, value), place))
        for name, reasons in table.get("unreachable", {}).items():
            unreachable.update({Value(name, value): reason for value, reason in reasons.items()})
    return {**_table(counts, first, unreachable),
            "combinations_reached": max(t["combinations_reached"] for t in tables),
            "combinations_lower_bound": len(tables) > 1}


_LISTED = 8  # the values never reached that the terminal's line names; a campaign stopped at its first case has ~50


def describe(table: dict) -> str:
    """The table in one line for the terminal: by which case every value was reached, or the values never reached;
    and the values this campaign cannot reach, with why."""
    reached = sum(1 for name, values in table["dimensions"].items() for count in values.values() if count)
    never = [f"{name} {value}" for name, values in table["unreached"].items() for value in values]
    impossible = [f"{name} {value} ({reason})" for name, reasons in table["unreachable"].items()
                  for value, reason in reasons.items()]
    if never:
        listed = never[:_LISTED] + ([f"and {len(never) - _LISTED} more (summary.json lists them)"]
                                    if len(never) > _LISTED else [])
        text = f"{reached} of {len(VALUES)} values reached; never reached: {', '.join(listed)}"
    else:
        text = f"every {'reachable ' if impossible else ''}value reached by case {table['reached_by']}"
    return text + (f"; unreachable here: {'; '.join(impossible)}" if impossible else "")
