"""Coverage-first cases: the first drawn cases of a campaign reach every value of the coverage table.

Drawn at random, a campaign of 60 cases left values of the table unreached (an IDLE batch, a DECODE
replay, a gate, the sparse threshold), and a bug that lives only there went unseen however good the
oracles. The coverage-first phase draws, after the seed cases, cases each aimed at one value of the
table (`covering_cases`): the value's aim pins what the value needs (a mode, a gate, a token count,
a second replay of one bucket, ...) and hypothesis draws everything else with the campaign's own
strategies, within the same rules: a case closes at most one condition of the publish decision, its
geometry stays within the profile's budget, it has only the switches, sizes and graph contracts its
target can run.

A case's values are a function of the case alone (`coverage.values`), so the phase's state is what
the stream's cases reached so far (`CoverageFirst`), the same on every shard whichever cases it
judges. The campaign keeps a drawn case only if it reaches a value not yet reached, and ends the
phase once every value it can reach is reached. The aim itself is drawn, not chosen from that state:
hypothesis replays a case's choices to shrink it and from the example database, and a strategy that
depended on the state would draw another case from them. The values no case of the campaign can have (a gate
its target cannot run) are `unreachable`, each with the reason, and the summary names them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Callable, Optional

from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from harness.case import GRAPH_CONTRACTS, MUTATION_KINDS, Case, Dims, Flags, Request
from harness.coverage import (BUCKET_EDGES, C4_RATIO, CARRY_ORDERS, FOLLOWS_LARGER_DRAFT_REPLAY,
                             FOLLOWS_LARGER_REPLAY, FOLLOWS_PLANNED, FOLLOWS_PUBLISH, HISPARSE_READS, RUNNERS,
                             THRESHOLD_EDGES, TOKEN_DECADES, Value, carry, edge, holds_c4_block, runner)
from harness.coverage import values as values_of
from harness.model.enums import ForwardMode, SpeculativeAlgorithm
from harness.model.metadata import LARGE_INDEXER_QUERY_THRESHOLD
from harness.policy import graph_bucket
from harness.semantics import Semantics
from harness.strategies import (ANY_REQUESTS, BUCKETS, DECADES, DELAYS, KV_OFFLOAD, LAYERS, REPLAYABLE, THRESHOLD_DIMS,
                                batch, flags, for_target, large_dims, publishes, skewed_requests, small_dims,
                                without_paths)

FIRST_CASES = 40  # the most cases the coverage-first phase keeps (the table has 71 values; a case reaches ten or so)
# The gates of the table and the switch that closes each (READ_DONE off and open need none).
GATE_SWITCHES = {"coarse barrier": "SGLANG_FORCE_COARSE_WAR_BARRIER", "cp_active": "cp_active", "hisparse": "hisparse",
                 **{name: name for name in KV_OFFLOAD}}
# A second replay of a bucket: modes that keep the batch's requests (a MIXED batch gains a decode request, which
# can move it to the next bucket).
_REUSING_MODES = [ForwardMode.EXTEND, ForwardMode.DECODE, ForwardMode.TARGET_VERIFY]
# A first replay with a smaller padded one below it (2 tokens pad to 4); the smaller one's prefixes kept short, as
# the replayable requests' are.
_PADDABLE = REPLAYABLE.filter(lambda reqs: sum(r.extend_len for r in reqs) >= 3)
_FEWER_PREFIX = 48
# A small case with a c4 block to read: a ratio-4 layer, a request of a block or more.
_C4_LAYERS = [layers for layers in LAYERS if C4_RATIO in layers]
_C4_REQUESTS = ANY_REQUESTS.filter(holds_c4_block)
# Two replayed draft extends, the second of fewer requests padded to a bucket of the speculative capture list
# (`coverage.FOLLOWS_LARGER_DRAFT_REPLAY`): 9, 11 or 13 requests (buckets 10, 12, 14), after up to three more; a
# request's draft width and prefix short, as EAGLE's MTP drafts a few tokens.
_EAGLE_FAMILY = [s for s in SpeculativeAlgorithm if s.is_eagle_family()]
_DRAFT_WIDE_MODES = [m for m in ForwardMode if m.is_draft_wide()]
_PADDED_DRAFTS = (9, 11, 13)
_DRAFT_PREFIX = 16
# Modes that never publish, each with requests whose tables the scheduler may rewrite.
_QUIET_MODES = (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND)


def padded_counts_below(tokens: int) -> list[int]:
    """The token counts under `tokens` that the prefill graph replays padded (a bucket above the count, within the
    runner's padding bound)."""
    return [n for n in range(1, tokens) if graph_bucket(n) not in (None, n)]


@dataclass(frozen=True)
class Aim:
    """What a covering case pins; hypothesis draws the rest. `closed`: the one condition of the publish decision
    the case closes (a gate of the table, "spec", "bcg", or "open" for none); `spec`: None draws one that agrees
    with `closed`; `graph`: None draws eager or replayed; `reuse`: a second replay of the first batch's bucket,
    `between`: with a replay of another bucket before it, `reuse_mode`: that replay's mode (None: drawn);
    `fewer`: a second replay, an EXTEND batch of fewer live tokens than the first and padded, so its padded rows are
    rows the first had live; `then`: a second batch of one of these modes (drawn, as is whether it replays);
    `tokens`: the first batch's token count (None: a small batch of a few requests), at the sizes `dims` (None:
    drawn within the budget); `sparse`: the sparse-prefill switch (None: drawn); `c4_block`: a small first batch
    with a c4 block to read (`coverage.reads_c4_blocks`); `drafts_fewer`: an EAGLE-family case whose first batch is
    a replayed verify or draft extend, then one of fewer requests, padded (`_draft_padding`)."""

    closed: str = "open"
    spec: Optional[SpeculativeAlgorithm] = None
    mode: ForwardMode = ForwardMode.EXTEND
    graph: Optional[bool] = False
    reuse: bool = False
    between: bool = False
    reuse_mode: Optional[ForwardMode] = None
    fewer: bool = False
    then: tuple[ForwardMode, ...] = ()
    tokens: Optional[SearchStrategy] = None
    dims: Optional[Dims] = None
    kinds: tuple[str, ...] = MUTATION_KINDS
    sparse: Optional[bool] = None
    contract: str = "fresh"
    c4_block: bool = False
    drafts_fewer: bool = False


def unreachable(*, without: frozenset[str], cannot_run: frozenset[str],
                contracts: tuple[str, ...] = GRAPH_CONTRACTS) -> dict[Value, str]:
    """The values no case of a campaign can have, each with why: a gate whose switch it never turns on (--without,
    or a switch the target cannot run), HiSparse's eviction and c4 reads without HiSparse (its sparse prefill's
    without that path), a graph contract the target lacks."""
    def off(switch: str) -> Optional[str]:
        return (f"the target cannot run {switch}" if switch in cannot_run
                else f"--without {switch}" if switch in without else None)

    reasons = {Value("gate", name): off(switch) for name, switch in GATE_SWITCHES.items()}
    no_hisparse = off("hisparse") and f"needs hisparse: {off('hisparse')}"
    for value in (Value("mutation", "hisparse_evict"), *(Value("hisparse c4 read", read) for read in HISPARSE_READS)):
        reasons[value] = no_hisparse
    if Flags.HISPARSE_SPARSE_PREFILL in without and not no_hisparse:
        reasons[Value("hisparse c4 read", HISPARSE_READS[0])] = f"--without {Flags.HISPARSE_SPARSE_PREFILL}"
    lacks = {c: f"the target replays its prefill graph under {' and '.join(contracts)} only"
             for c in GRAPH_CONTRACTS if c not in contracts}
    reasons.update({Value("contract", c): reason for c, reason in lacks.items()})
    reasons.update({Value("carry", carry(c, order)): reason for c, reason in lacks.items() for order in CARRY_ORDERS})
    return {value: reason for value, reason in reasons.items() if reason}


@dataclass
class CoverageFirst:
    """The coverage-first phase of one run of the case stream: the values its cases reached so far, the seed
    cases' included, whichever shard judges them; `kept`: the phase's cases, with their schedule."""

    reachable: frozenset[Value]
    reached: set[Value] = field(default_factory=set)
    kept: set[tuple[str, str]] = field(default_factory=set)
    judged: set[tuple[str, str]] = field(default_factory=set)  # kept cases whose judgement returned (raised nothing)

    @property
    def cases(self) -> int:
        return len(self.kept)

    def add(self, case: Case) -> None:
        self.reached |= values_of(case)

    def keeps(self, case: Case, schedule: str) -> bool:
        """Whether `case` reaches a value the stream has not reached yet; if so it is one of the phase's cases.
        A case the phase kept already is kept again where its judgement raised: hypothesis runs a draw that raised
        once more to see it raise again, and a rejection then would be its "unreliable assumption" (a flaky error
        hiding the real one). One judged and met again (another value's aim drew the same case) is nothing
        new: kept again, it would be counted twice as two places of the stream."""
        key = (case.to_json(), schedule)
        if key in self.kept:
            return key not in self.judged
        if not values_of(case) & (self.reachable - self.reached):
            return False
        self.add(case)
        self.kept.add(key)
        return True

    def mark_judged(self, case: Case, schedule: str) -> None:
        """The kept `case`'s judgement returned: met again, it is nothing new (`keeps`)."""
        self.judged.add((case.to_json(), schedule))

    @property
    def complete(self) -> bool:
        return self.reachable <= self.reached


def covering_cases(semantics: str, *, budget: int, reachable: tuple[Value, ...],
                   dims: tuple[tuple[str, object], ...] = (), contracts: tuple[str, ...] = GRAPH_CONTRACTS,
                   uniform_draft_width: bool = False, without: frozenset[str] = frozenset()):
    """Cases each aimed at one of `reachable` (drawn), at the target's sizes, graph contracts and draft width,
    taking none of the paths `without` names (`cases`; its gates' values are not among `reachable`)."""
    return for_target(without_paths(st.sampled_from(reachable).flatmap(
        functools.partial(aimed_at, semantics=Semantics(semantics), budget=budget)), without), dims, contracts,
        uniform_draft_width)


@functools.lru_cache(maxsize=None)
def aimed_at(value: Value, *, semantics: Semantics, budget: int) -> SearchStrategy[Case]:
    """Cases that reach `value`: one of its aims, drawn. Built once for each value, as hypothesis works out a new
    strategy's properties before its first draw."""
    return st.one_of([aimed_case(aim, semantics=semantics, budget=budget)
                      for aim in _AIMS[value.dimension](value.value, semantics, budget)])


@st.composite
def aimed_case(draw, aim: Aim, *, semantics: Semantics, budget: int) -> Case:
    closed, offloads = ("KV offload", (aim.closed,)) if aim.closed in KV_OFFLOAD else (aim.closed, KV_OFFLOAD)
    f = draw(flags(semantics, closed, offloads))
    if aim.sparse is not None:
        f = replace(f, SGLANG_OPT_FLASHMLA_SPARSE_PREFILL=aim.sparse)
    if aim.drafts_fewer:
        return draw(_draft_padding(semantics, f))
    spec = aim.spec or draw(st.sampled_from([s for s in SpeculativeAlgorithm
                                             if publishes(s, semantics) != (closed == "spec")]))
    if aim.c4_block:
        dims = replace(draw(small_dims()), layer_ratios=draw(st.sampled_from(_C4_LAYERS)))
        reqs = draw(_C4_REQUESTS)
    elif aim.tokens is None:
        dims, reqs = draw(small_dims()), draw(_PADDABLE if aim.fewer else REPLAYABLE if aim.graph else ANY_REQUESTS)
    else:
        total = draw(aim.tokens)
        dims, reqs = aim.dims or draw(large_dims(total, budget)), draw(skewed_requests(total))
    first = draw(batch(hisparse=f.hisparse, reqs=reqs, modes=[aim.mode], kinds_on=set(aim.kinds)))
    batches = [first if aim.graph is None else replace(first, graph=aim.graph)]
    if aim.between:
        bucket = graph_bucket(first.num_tokens)
        other = draw(REPLAYABLE.filter(
            lambda reqs: graph_bucket(sum(r.extend_len for r in reqs)) not in (None, bucket)))
        batches.append(replace(draw(batch(hisparse=f.hisparse, reqs=other, modes=_REUSING_MODES,
                                          kinds_on=set(aim.kinds))), graph=True))
    if aim.reuse:
        again = draw(batch(hisparse=f.hisparse, reqs=first.requests, modes=[aim.reuse_mode] if aim.reuse_mode
                           else _REUSING_MODES, kinds_on=set(aim.kinds)))
        batches.append(replace(again, graph=True))
    if aim.fewer:
        live = draw(st.sampled_from(padded_counts_below(first.num_tokens)))
        fewer = draw(batch(hisparse=f.hisparse, reqs=draw(skewed_requests(live, max_prefix=_FEWER_PREFIX)),
                           modes=[ForwardMode.EXTEND], kinds_on=set(aim.kinds)))
        batches.append(replace(fewer, graph=True))
    if aim.then:
        batches.append(draw(batch(hisparse=f.hisparse, modes=list(aim.then), kinds_on=set(aim.kinds))))
    return Case(semantics=semantics, spec=spec, flags=f, dims=dims, batches=tuple(batches), graph_contract=aim.contract,
                delay_cycles=draw(st.sampled_from(DELAYS)), data_seed=draw(st.integers(0, 2**16)))


@st.composite
def _draft_padding(draw, semantics: Semantics, f: Flags) -> Case:
    """An EAGLE-family case whose draft extends replay more requests, then fewer, padded to a bucket: the second's
    padded requests sit in rows of the static buffer that the first's requests had (`FOLLOWS_LARGER_DRAFT_REPLAY`).
    Each batch a verify or a draft extend, every request at one draft width; the mutations drawn."""
    width = draw(st.integers(1, 4))
    padded = draw(st.sampled_from(_PADDED_DRAFTS))
    counts = (draw(st.integers(padded + 1, padded + 3)), padded)
    batches = []
    for count in counts:
        prefixes = draw(st.lists(st.integers(0, _DRAFT_PREFIX), min_size=count, max_size=count))
        drafted = draw(batch(hisparse=f.hisparse, reqs=tuple(Request(p, width) for p in prefixes),
                             modes=_DRAFT_WIDE_MODES))
        batches.append(replace(drafted, graph=True))
    return Case(semantics=semantics, spec=draw(st.sampled_from(_EAGLE_FAMILY)), flags=f, dims=draw(small_dims()),
                batches=tuple(batches), delay_cycles=draw(st.sampled_from(DELAYS)),
                data_seed=draw(st.integers(0, 2**16)))


# -- the aims of each value, by dimension: (value, semantics, budget) -> aims ----------------------------------------

def _mode(value: str, semantics: Semantics, budget: int) -> tuple[Aim, ...]:
    mode = ForwardMode[value]
    return (Aim(mode=mode, graph=False if mode is ForwardMode.IDLE else None),)


def _spec(value: str, semantics: Semantics, budget: int) -> tuple[Aim, ...]:
    spec = SpeculativeAlgorithm[value]
    return (Aim(spec=spec, closed="open" if publishes(spec, semantics) else "spec"),)


_PHASES = {"eager": Aim(graph=False), "first graph replay": Aim(graph=True), "reused bucket": Aim(graph=True, reuse=True)}
# A draft extend runs only where a draft model does (EAGLE's family, none of which publishes): its runners' aims draw a
# spec that closes publication.
_RUNNERS = {runner(mode, graph): Aim(mode=mode, graph=graph,
                                     closed="spec" if mode is ForwardMode.DRAFT_EXTEND else "open")
            for mode, graph in RUNNERS}
# A batch that must not publish, each for another reason: the switch off, its spec, its mode.
_CLOSING = (Aim(closed="READ_DONE off"), Aim(closed="spec"), *(
    Aim(mode=mode, graph=False) for mode in (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND,
                                             ForwardMode.IDLE)))
_THRESHOLD_SHIFTS = {name: shift for shift, name in THRESHOLD_EDGES.items()}
_BUCKET_SHIFTS = {name: shift for shift, name in BUCKET_EDGES.items()}


def _edge(value: str, semantics: Semantics, budget: int) -> tuple[Aim, ...]:
    """A first batch of as many tokens as the edge, where the edge decides: at the sparse threshold (or one off it)
    with the sparse-prefill switch off, else the threshold decides nothing, at the sizes the drawn threshold cases
    have; at a prefill-graph bucket (or one off it) replayed, which pads to a bucket. Or at neither."""
    if value in _THRESHOLD_SHIFTS:
        return (Aim(tokens=st.just(LARGE_INDEXER_QUERY_THRESHOLD + _THRESHOLD_SHIFTS[value]), dims=THRESHOLD_DIMS,
                    sparse=False),)
    if value in _BUCKET_SHIFTS:
        shift = _BUCKET_SHIFTS[value]
        return (Aim(tokens=st.sampled_from([b + shift for b in BUCKETS if b + shift <= budget]), graph=True),)
    return (Aim(tokens=st.integers(1, 999).filter(lambda n: edge(n) == "no edge")),)


def _tokens(value: str, semantics: Semantics, budget: int) -> tuple[Aim, ...]:
    low, high = DECADES[TOKEN_DECADES.index(value)]
    return (Aim(tokens=st.integers(low, min(high, budget))),)


_CARRIES = {carry(contract, order): Aim(graph=True, reuse=True, between=order == CARRY_ORDERS[1],
                                        reuse_mode=ForwardMode.EXTEND, sparse=True, contract=contract,
                                        closed="bcg" if contract == "bcg" else "open")
            for contract in GRAPH_CONTRACTS for order in CARRY_ORDERS}


# a replay, then a smaller padded EXTEND replay whose padded rows the first had live; an EXTEND batch that publishes
# (`closed` open), then one of a mode that publishes nothing; a batch with requests, then an idle step
_FOLLOWS = {FOLLOWS_LARGER_REPLAY: Aim(graph=True, fewer=True), FOLLOWS_PUBLISH: Aim(graph=False, then=_QUIET_MODES),
            FOLLOWS_PLANNED: Aim(graph=False, then=(ForwardMode.IDLE,)),
            FOLLOWS_LARGER_DRAFT_REPLAY: Aim(closed="spec", drafts_fewer=True)}


_AIMS: dict[str, Callable[[str, str, int], tuple[Aim, ...]]] = {
    "mode": _mode,
    "spec": _spec,
    "graph": lambda value, semantics, budget: (_PHASES[value],),
    "runner": lambda value, semantics, budget: (_RUNNERS[value],),
    "contract": lambda value, semantics, budget: (Aim(graph=True, contract=value,
                                                      closed="bcg" if value == "bcg" else "open"),),
    "publish": lambda value, semantics, budget: (Aim(),) if value == "publish" else _CLOSING,
    "gate": lambda value, semantics, budget: (Aim(closed=value),),
    "mutation": lambda value, semantics, budget: (Aim(kinds=(value,),
                                                      closed="hisparse" if value == "hisparse_evict" else "open"),),
    "attention": lambda value, semantics, budget: (Aim(sparse=value == "sparse"),),
    "edge": _edge,
    "tokens": _tokens,
    # a sparse replay (the switch on: its EXTEND batch builds the chunk cache at any size) whose bucket a sparse
    # EXTEND batch (the one that would read a kept cache) replays again, at once or after another bucket's replay
    "carry": lambda value, semantics, budget: (_CARRIES[value],),
    "follows": lambda value, semantics, budget: (_FOLLOWS[value],),
    # an eager HiSparse prefill (the batch a target runs through its own backend) with a c4 block to read
    "hisparse c4 read": lambda value, semantics, budget: (Aim(closed="hisparse", sparse=value == HISPARSE_READS[0],
                                                              c4_block=True),),
}
