"""The protocol's shapes a campaign reached, batch by batch, and the ones it never reached.

A shape is one value per dimension: forward mode, speculative algorithm, eager / first graph replay
/ reused bucket, the expected publish decision, the gate that closes it, a mutation kind, sparse or
dense, and where the token count sits against a graph bucket or the sparse threshold. The full
product has hundreds of thousands of shapes, most of which no batch can have (an IDLE batch has no
tokens to be sparse), so the table is factored: one count per value of each dimension, plus the
number of distinct combinations reached. A value with count 0 is listed as never reached.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from harness.case import MUTATION_KINDS, Case
from harness.model.enums import ForwardMode, SpeculativeAlgorithm
from harness.model.metadata import LARGE_INDEXER_QUERY_THRESHOLD
from harness.model.runners import generate_prefill_cuda_graph_batch_sizes
from harness.policy import GRAPH_MAX_BS, expected_publish, graph_bucket, runs_graph

GRAPH_PHASES = ("eager", "first graph replay", "reused bucket")
GATES = ("open", "READ_DONE off", "coarse barrier", "cp_active", "hisparse", "hierarchical_cache",
         "hicache_storage", "lmcache")
EDGES = ("bucket-1", "bucket", "bucket+1", "threshold-1", "threshold", "threshold+1", "no edge")
TOKEN_DECADES = ("1-9", "10-99", "100-999", "1000-9999", "10000+")
DIMENSIONS = {
    "mode": tuple(m.name for m in ForwardMode),
    "spec": tuple(s.name for s in SpeculativeAlgorithm),
    "graph": GRAPH_PHASES,
    "publish": ("publish", "no publish"),
    "gate": GATES,
    "mutation": MUTATION_KINDS,
    "attention": ("sparse", "dense"),
    "edge": EDGES,
    "tokens": TOKEN_DECADES,
}
_BUCKETS = frozenset(generate_prefill_cuda_graph_batch_sizes(GRAPH_MAX_BS))


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
    for offset, name in ((0, "threshold"), (1, "threshold+1"), (-1, "threshold-1")):
        if num_tokens == LARGE_INDEXER_QUERY_THRESHOLD + offset:
            return name
    for offset, name in ((0, "bucket"), (1, "bucket+1"), (-1, "bucket-1")):
        if num_tokens - offset in _BUCKETS:
            return name
    return "no edge"


def decade(num_tokens: int) -> str:
    return TOKEN_DECADES[min(len(str(max(num_tokens, 1))) - 1, len(TOKEN_DECADES) - 1)]


def batch_shapes(case: Case) -> list[dict[str, str]]:
    """One shape per (batch, mutation kind) of the case; a batch without mutations has none."""
    shapes, replayed = [], set()
    for batch in case.batches:
        graph = runs_graph(batch)
        bucket = graph_bucket(batch.num_tokens) if graph else None
        phase = "eager" if not graph else "reused bucket" if bucket in replayed else "first graph replay"
        if graph:
            replayed.add(bucket)
        rows = bucket if graph else batch.num_tokens
        sparse = batch.mode is ForwardMode.EXTEND and (
            rows > LARGE_INDEXER_QUERY_THRESHOLD or case.flags.SGLANG_OPT_FLASHMLA_SPARSE_PREFILL)
        common = {"mode": batch.mode.name, "spec": case.spec.name, "graph": phase,
                  "publish": "publish" if expected_publish(case, batch)[0] else "no publish", "gate": gate(case),
                  "attention": "sparse" if sparse else "dense", "edge": edge(batch.num_tokens),
                  "tokens": decade(batch.num_tokens) if batch.requests else ""}
        for kind in dict.fromkeys(m.kind for m in batch.mutations) or ("",):
            shapes.append({**common, "mutation": kind})
    return shapes


@dataclass
class Coverage:
    counts: dict[str, Counter] = field(default_factory=lambda: {d: Counter() for d in DIMENSIONS})
    combinations: Counter = field(default_factory=Counter)

    def add(self, case: Case) -> None:
        for shape in batch_shapes(case):
            for name, value in shape.items():
                if value:
                    self.counts[name][value] += 1
            self.combinations[tuple(shape[d] for d in DIMENSIONS)] += 1

    def to_dict(self) -> dict:
        return {
            "factored": True,
            "full_product": full_product_size(),
            "combinations_reached": len(self.combinations),
            "dimensions": {name: {value: self.counts[name][value] for value in values}
                           for name, values in DIMENSIONS.items()},
            "unreached": {name: [v for v in values if not self.counts[name][v]]
                          for name, values in DIMENSIONS.items() if any(not self.counts[name][v] for v in values)},
        }


def merge_tables(tables: list[dict]) -> dict:
    """The coverage of several parts of one campaign (shards, workers): counts add up. Their distinct
    combinations cannot be united from counts alone, so the merged figure is the largest part's, a
    lower bound, and says so."""
    counts = {name: Counter() for name in DIMENSIONS}
    for table in tables:
        for name, values in table["dimensions"].items():
            counts.setdefault(name, Counter()).update(values)
    return {
        "factored": True,
        "full_product": full_product_size(),
        "combinations_reached": max(t["combinations_reached"] for t in tables),
        "combinations_lower_bound": len(tables) > 1,
        "dimensions": {name: {value: counts[name][value] for value in values} for name, values in DIMENSIONS.items()},
        "unreached": {name: [v for v in values if not counts[name][v]]
                      for name, values in DIMENSIONS.items() if any(not counts[name][v] for v in values)},
    }
