"""Hypothesis strategies for cases: small by default, with branches that reach SGLang's real sizes
and shrink toward one or two requests.

Geometry spans what SGLang runs: token counts over every decade from 1 to 32k, each prefill-graph
bucket edge (bucket and bucket +- 1) and the 11673-token sparse threshold +- 1 weighted in, 1 to 64
requests of skewed lengths, prefixes up to 16k, and DSV4's page size 256, window 128 and top-k 512
beside small ones. A case's cost is about tokens x layers x heads; each profile has a budget
(`PROFILE_BUDGETS`) that a drawn geometry stays within, so `ci` stays fast and `nightly` reaches
real head counts.

Each case also draws a swarm (Groce et al., "Swarm testing"): groups of modes, spec families, gates
and mutation kinds switched on or off together, so a case often has few features and the rare
combinations of the ones it has are reached.

Publication is decided by a conjunction (`harness.policy.expected_publish`): the case's gates and
speculative algorithm, each batch's mode and graph contract. A case closes at most one of its own
conditions and leaves every other at the value that publishes, and its first batch is an EXTEND
that would then publish: the closed condition is the sole cause of the decision (the unique-cause
rule of MC/DC). A bug in one gate shows only where that gate alone decides; drawn independently,
a closed gate was almost always masked by another condition that closed publication as well.
"""

from __future__ import annotations

import functools
from dataclasses import replace

from hypothesis import strategies as st

from harness.case import CP_SIZE, GRAPH_CONTRACTS, LIMITS, MUTATION_KINDS, Batch, Case, Dims, Flags, Mutation, Request
from harness.errors import InvalidArgument
from harness.model.enums import ForwardMode, SpeculativeAlgorithm
from harness.model.metadata import LARGE_INDEXER_QUERY_THRESHOLD
from harness.model.runners import generate_prefill_cuda_graph_batch_sizes
from harness.policy import GRAPH_MAX_BS, graph_bucket
from harness.semantics import Semantics

S = SpeculativeAlgorithm
_SPECS = {
    Semantics.V0_5_23: [S.NONE, S.NONE, S.DFLASH, S.DSPARK, S.EAGLE, S.EAGLE3, S.NEXTN, S.STANDALONE, S.NGRAM],
    Semantics.PR: [S.DFLASH, S.DFLASH, S.DSPARK, S.NONE, S.EAGLE, S.EAGLE3, S.NEXTN, S.STANDALONE, S.NGRAM],
}
# Swarm groups: a case switches each group on or off; a case that switches all off keeps all. The
# spec families choose among the algorithms that close publication (a case whose closed condition is
# its spec); the publishing ones are the only choice of every other case.
_SPEC_FAMILIES = {"eagle": {S.EAGLE, S.EAGLE3, S.NEXTN, S.STANDALONE}, "ngram": {S.NGRAM}, "none": {S.NONE}}
_MODE_GROUPS = {"extend": {ForwardMode.EXTEND}, "mixed": {ForwardMode.MIXED},
                "speculative": {ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND},
                "decode": {ForwardMode.DECODE, ForwardMode.IDLE}}
# The condition a case closes: none ("open"), the first batch's mode, one gate, its spec, or (for its
# graph replays) the breakable-graph contract; each about as often as the others, open twice as often
# (most bugs are in what publication lets the scheduler do, and the threshold cases are open too) and
# the breakable-graph contract twice (its replays run the other graph backend of SGLang's runner). A
# campaign of 60 cases draws each entry about five times (every example is a fresh draw:
# `campaign.pinned_stream`). The three KV-offload switches are one gate (`Flags.offloads_kv`): one
# entry, then one of the three.
KV_OFFLOAD = ("hierarchical_cache", "hicache_storage", "lmcache")
CLOSED_CONDITIONS = ["open", "open", "mode", "spec", "READ_DONE off", "coarse barrier", "cp_active", "hisparse",
                     "KV offload", "bcg", "bcg"]
# "mode": the first batch's forward mode is what decides, every gate open. Mostly MIXED: eager, every release
# runs it as EXTEND and it publishes; replayed, it does not; each reading is a regression someone wrote.
_DECIDING_MODES = [ForwardMode.MIXED] * 3 + [ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND,
                                             ForwardMode.IDLE]
_GATE_FLAGS = {"coarse barrier": "SGLANG_FORCE_COARSE_WAR_BARRIER", "cp_active": "cp_active", "hisparse": "hisparse"}


@functools.lru_cache(maxsize=None)
def closed_conditions(without: frozenset[str] = frozenset()) -> list[str]:
    """CLOSED_CONDITIONS without the gates whose switch a target cannot run (`Target.cannot_run`); the same list
    object when nothing is left out, so a default campaign's stream is unchanged."""
    if not without:
        return CLOSED_CONDITIONS
    return [c for c in CLOSED_CONDITIONS if _GATE_FLAGS.get(c) not in without
            and not (c == "KV offload" and set(KV_OFFLOAD) <= without)]

# tokens x layers x heads a drawn geometry may reach: `ci` reaches the threshold with one small layer,
# `nightly` real head counts (64) at a few thousand tokens.
PROFILE_BUDGETS = {"dev": 12_000, "ci": 12_000, "nightly": 2_000_000}
BUCKETS = generate_prefill_cuda_graph_batch_sizes(GRAPH_MAX_BS)
MAX_TOKENS = 32_768
MAX_PREFIX = 16_384
# The most context (prefixes and new tokens) a drawn decode batch keeps at its drawn lengths: as much as a drawn
# extend can hold. Without it a request of n new tokens after a long prefix became n running requests of that prefix
# each: 251 of ~1,900 tokens (a 463k-slot pool, 13 to 22 GB a case) ran an 80 GB card out of memory at --jobs 4,
# and a 256-request one the 24 GiB CI machine.
MAX_DECODE_CONTEXT = MAX_PREFIX + MAX_TOKENS
DECADES = [(1, 9), (10, 99), (100, 999), (1000, 9999), (10_000, MAX_TOKENS)]
DELAYS = [0, 20_000_000, 100_000_000]  # a drawn case's delay of the scheduler's mutations, in cycles
# A MIXED batch a quarter of the time: eager, every release runs it as EXTEND (it publishes), replayed it
# does not, and both readings are bugs someone has written.
_MODES = [ForwardMode.EXTEND] * 8 + [ForwardMode.MIXED] * 4 + [ForwardMode.DECODE, ForwardMode.TARGET_VERIFY,
                                                               ForwardMode.DRAFT_EXTEND, ForwardMode.IDLE]
_SECOND_MODES = [ForwardMode.EXTEND, ForwardMode.MIXED, ForwardMode.MIXED, ForwardMode.DECODE,
                 ForwardMode.TARGET_VERIFY]
LAYERS = [(0, 4, 128), (0, 4), (4,), (0,), (128, 0)]


def _switched_on(draw, groups: dict) -> set:
    """The union of the groups this case switches on (all of them when it switches none on)."""
    on = [members for members in groups.values() if draw(st.booleans())]
    return set().union(*on) if on else set().union(*groups.values())


def _rare(weight: int = 8):
    """False most of the time: a switch that closes a gate should not hide every other path."""
    return st.sampled_from([False] * (weight - 1) + [True])


def publishes(spec: SpeculativeAlgorithm, semantics: Semantics) -> bool:
    """Whether `spec` lets an EXTEND batch publish when every gate is open (the spec rules of
    `harness.policy.expected_publish`)."""
    return spec.is_dflash_family() if semantics.dflash_family_only else spec.supports_prefill_shared_read_done()


@st.composite
def flags(draw, semantics: Semantics, closed: str = "open", offloads: tuple[str, ...] = KV_OFFLOAD) -> Flags:
    """The switches of a case whose only closed condition is `closed`: a gate ("READ_DONE off", a
    flag, "KV offload"), or anything else for all gates open. READ_DONE on or off is given explicitly
    or left to the semantics' default, whichever says the same."""
    read_done = closed != "READ_DONE off"
    default = semantics.read_done_by_default
    enable = draw(st.sampled_from([read_done] * 3 + ([None] if default == read_done else [])))
    gate = draw(st.sampled_from(offloads)) if closed == "KV offload" else _GATE_FLAGS.get(closed)
    return Flags(SGLANG_ENABLE_PREFILL_WAR_READ_DONE=enable,
                 SGLANG_OPT_FLASHMLA_SPARSE_PREFILL=draw(st.sampled_from([True, True, False])),
                 **({gate: True} if gate else {}))


@st.composite
def mutations(draw, *, hisparse: bool, kinds_on=MUTATION_KINDS) -> tuple[Mutation, ...]:
    kinds = ([k for k in MUTATION_KINDS if (k != "hisparse_evict" or hisparse) and k in kinds_on]
             or ["req_to_token_rewrite"])
    return tuple(draw(_mutation_lists(tuple(kinds))))


# The strategies below are built once for each set of arguments: hypothesis validates a new strategy
# object and works out its properties before its first draw, which was a third of drawing a case when
# each draw built its own. The same structure draws the same choices, so the stream is unchanged.
@functools.lru_cache(maxsize=None)
def _mutation_lists(kinds: tuple[str, ...]):
    return st.lists(st.builds(
        Mutation, kind=st.sampled_from(kinds), target=st.sampled_from(["batch", "batch", "batch", "other"]),
        count=st.integers(1, 6), poison=_rare(4)), min_size=1, max_size=3)


@functools.lru_cache(maxsize=None)
def requests(max_requests: int = 4, max_prefix: int = 48, max_extend: int = 24, min_extend: int = 1):
    return st.lists(st.builds(Request, prefix_len=st.integers(0, max_prefix),
                              extend_len=st.integers(min_extend, max_extend)),
                    min_size=1, max_size=max_requests).map(tuple)


# A graph replay pads to the smallest bucket (4 tokens) and refuses beyond twice the real count, so a
# batch of one token never replays: the requests of replayed geometries extend by two tokens or more.
REPLAYABLE = st.one_of(requests(min_extend=2), requests(max_requests=2, max_prefix=300, max_extend=40, min_extend=2))
ANY_REQUESTS = st.one_of(requests(), requests(max_requests=2, max_prefix=300, max_extend=40))


def decode_requests(reqs: tuple[Request, ...]) -> tuple[Request, ...]:
    """The drawn requests as a decode step's: every SGLang decode step adds one token a request, so a drawn request
    of n new tokens becomes n running requests of one token each, at consecutive lengths. The batch keeps its
    token count (so its graph bucket, which the coverage aims count on) up to the request limit. A running request
    keeps its drawn prefix while the batch's context stays within `MAX_DECODE_CONTEXT`; past it, its length is its
    offset alone (still consecutive, so every compressor phase stays drawn)."""
    running: list[Request] = []
    context = 0
    for r in reqs:
        for offset in range(r.extend_len):
            prefix = r.prefix_len + offset if context + r.prefix_len + offset < MAX_DECODE_CONTEXT else offset
            running.append(Request(prefix, 1))
            context += prefix + 1
            if len(running) == LIMITS["requests"]:
                return tuple(running)
    return tuple(running)


# The most draft tokens a drawn draft extend gives a request (`--speculative-num-draft-tokens`: DSV4's MTP runs a few).
MAX_DRAFT_TOKENS = 8


def draft_extend_requests(reqs: tuple[Request, ...]) -> tuple[Request, ...]:
    """The drawn requests as a draft extend after a verify: SGLang's worker gives every request the server's draft
    width (`prepare_for_draft_extend`), here the first drawn request's new tokens, at most `MAX_DRAFT_TOKENS`."""
    width = min(reqs[0].extend_len, MAX_DRAFT_TOKENS)
    return tuple(Request(r.prefix_len, width) for r in reqs)


@st.composite
def batch(draw, *, hisparse: bool, reqs=None, modes=None, modes_on=None, kinds_on=MUTATION_KINDS) -> Batch:
    modes = modes or _MODES
    mode = draw(st.sampled_from([m for m in modes if modes_on is None or m in modes_on] or modes))
    if reqs is None:
        reqs = draw(ANY_REQUESTS)
    muts = draw(mutations(hisparse=hisparse, kinds_on=kinds_on))
    if mode is ForwardMode.IDLE:  # nothing in flight: the scheduler still rewrites rows of other requests
        reqs = ()
        muts = (Mutation("req_to_token_rewrite", target="other"),)
    elif mode is ForwardMode.DECODE:
        reqs = decode_requests(reqs)
    elif mode is ForwardMode.DRAFT_EXTEND:
        reqs = draft_extend_requests(reqs)
    elif mode is ForwardMode.MIXED and all(r.extend_len > 1 for r in reqs):
        reqs = reqs + (Request(draw(st.integers(1, 40)), 1),)  # a running decode request mixed in
    return Batch(mode=mode, requests=reqs, graph=draw(st.booleans()), mutations=muts)


@st.composite
def token_total(draw, limit: int) -> int:
    """A batch's token count: one decade drawn evenly, then a count in it; or a graph bucket edge."""
    if draw(st.booleans()):
        low, high = draw(st.sampled_from([d for d in DECADES if d[0] <= limit]))
        total = draw(st.integers(low, min(high, limit)))
    else:
        total = draw(st.sampled_from(BUCKETS + [LARGE_INDEXER_QUERY_THRESHOLD])) + draw(st.sampled_from([-1, 0, 1]))
    return max(1, min(total, limit))


@st.composite
def skewed_requests(draw, total: int, *, max_prefix: int = MAX_PREFIX) -> tuple[Request, ...]:
    """1 to 64 requests sharing `total` tokens, with skewed lengths (squared random weights), and
    prefixes that together stay under `max_prefix`."""
    count = draw(st.one_of(st.integers(1, min(4, total)), st.integers(1, min(64, total))))
    weights = [w * w for w in draw(st.lists(st.integers(1, 32), min_size=count, max_size=count))]
    lengths = [1 + (total - count) * w // sum(weights) for w in weights]
    lengths[0] += total - sum(lengths)
    prefix_cap = max_prefix // count
    prefixes = draw(st.lists(st.one_of(st.integers(0, 16), st.integers(0, prefix_cap)), min_size=count, max_size=count))
    return tuple(Request(p, n) for p, n in zip(prefixes, lengths))


@st.composite
def large_dims(draw, total: int, budget: int) -> Dims:
    """Sizes for a big batch: SGLang's page size 256 (or 64, 128; small pages make the per-row page
    table the cost), window and top-k small or SGLang's 128 and 512, and as many layers and heads as
    the budget leaves."""
    layers = draw(st.sampled_from([lr for lr in LAYERS if total * len(lr) <= budget] or [(0,)]))
    head_options = [h for h in (1, 2, 64) if total * len(layers) * h <= budget] or [1]
    heads = draw(st.sampled_from(head_options))
    return Dims(heads=heads, head_dim=512 if heads == 64 else draw(st.sampled_from([4, 8])),
                swa_window=draw(st.sampled_from([8, 128])), index_topk=draw(st.sampled_from([4, 512])),
                index_dim=4, page_size=draw(st.sampled_from([64, 128, 256])), layer_ratios=layers,
                index_align=draw(st.sampled_from([8, 128])))


@st.composite
def small_dims(draw) -> Dims:
    """The sizes of a small case: a few heads and layers, small windows and pages."""
    return Dims(
        heads=draw(st.sampled_from([1, 2])), head_dim=draw(st.sampled_from([4, 8])),
        swa_window=draw(st.sampled_from([4, 8, 16])), index_topk=draw(st.sampled_from([2, 4])),
        index_dim=4, page_size=draw(st.sampled_from([1, 2, 4, 8, 16])), layer_ratios=draw(st.sampled_from(LAYERS)),
    )


# The sizes of a case at the sparse threshold: one SWA layer of one small head, so that its 11673 tokens cost a
# fraction of a second on the CPU (a compressed layer's indexer at that count costs seconds a forward), with DSV4's
# page size.
THRESHOLD_DIMS = Dims(heads=1, head_dim=4, swa_window=8, index_topk=4, index_dim=4, page_size=256, layer_ratios=(0,),
                      index_align=8)


@st.composite
def threshold_batch(draw, *, hisparse: bool) -> Batch:
    """Exactly around SGLang's sparse threshold, where the snapshot and the forward must agree."""
    # the threshold itself twice as often as a side: `>` read as `>=`, or as `> threshold - 1`, differs
    # only there
    total = LARGE_INDEXER_QUERY_THRESHOLD + draw(st.sampled_from([0, 0, -1, 1]))
    first = draw(st.integers(1, total - 1))
    return Batch(mode=ForwardMode.EXTEND, requests=(Request(0, first), Request(draw(st.integers(0, 8)), total - first)),
                 graph=False, mutations=draw(mutations(hisparse=hisparse)))


def cases(semantics: str = "0.5.23", *, large: bool = True, budget: int = PROFILE_BUDGETS["ci"],
          without: frozenset[str] = frozenset(), dims: tuple[tuple[str, object], ...] = (),
          contracts: tuple[str, ...] = GRAPH_CONTRACTS, uniform_draft_width: bool = False):
    """Cases; `large` lets some examples reach SGLang's sizes (the threshold, the bucket edges, every
    decade of tokens) within `budget` (tokens x layers x heads); `without`: switches never turned on (the
    target's `cannot_run`) and paths under one never taken (`Flags.PATHS`); `dims`: (field, value) pairs every
    case's `Dims` takes (the target's `fixed_dims`); `contracts`: the graph contracts the target has (its
    `graph_contracts`); `uniform_draft_width`: an EAGLE-family case's verify and draft-extend requests at one width
    (the target's `uniform_draft_width`). All are set after the draw, so the choices drawn, and a target's stream,
    stay those of the default ones."""
    return for_target(without_paths(_cases(semantics, large=large, budget=budget, without=without), without),
                      dims, contracts, uniform_draft_width)


def takes_hisparse_sparse_prefill(case: Case) -> bool:
    """Whether a batch of `case` may prefill sparse under HiSparse: the sparse-prefill switch on, or a batch past
    SGLang's sparse threshold, in a HiSparse case."""
    return case.flags.hisparse and (case.flags.SGLANG_OPT_FLASHMLA_SPARSE_PREFILL or any(
        b.num_tokens > LARGE_INDEXER_QUERY_THRESHOLD for b in case.batches))


def dense_under_hisparse(case: Case) -> Case:
    """`case` with the sparse-prefill switch off where HiSparse is on (`--without hisparse_sparse_prefill`)."""
    if not case.flags.hisparse:
        return case
    return replace(case, flags=replace(case.flags, SGLANG_OPT_FLASHMLA_SPARSE_PREFILL=False))


def without_paths(drawn, without: frozenset[str]):
    """Cases of `drawn` that take no path `without` names (`Flags.PATHS`), mapped only where it names one, so that a
    default campaign's strategy stays the one it draws: a HiSparse case with the sparse-prefill switch off, and one
    whose batch is past the sparse threshold drawn again."""
    if Flags.HISPARSE_SPARSE_PREFILL not in without:
        return drawn
    return drawn.map(dense_under_hisparse).filter(lambda case: not takes_hisparse_sparse_prefill(case))


def for_target(drawn, dims: tuple[tuple[str, object], ...], contracts: tuple[str, ...],
               uniform_draft_width: bool = False):
    """Cases of `drawn` at the target's fixed sizes, replayed under its graph contracts and at its one draft width
    (`cases`), mapped only where the target has any, so that a default campaign's strategy stays the one it draws."""
    if dims:
        drawn = drawn.map(functools.partial(with_dims, dims=dims))
    if contracts != GRAPH_CONTRACTS:
        drawn = drawn.map(functools.partial(with_contract, contracts=contracts))
    if uniform_draft_width:
        drawn = drawn.map(with_draft_width)
    return drawn


def with_dims(case: Case, dims: tuple[tuple[str, object], ...]) -> Case:
    """`case` with these `Dims` fields set (a target's fixed sizes)."""
    return replace(case, dims=replace(case.dims, **dict(dims))) if dims else case


def with_contract(case: Case, contracts: tuple[str, ...]) -> Case:
    """`case` replayed under the first of `contracts` where its own is not among them: a target whose system
    has one prefill-graph contract only (SGLang: a DSV4 server replays the breakable graph over its captured
    metadata, tc_piecewise being removed or turned off for DSV4) runs each drawn graph replay the way that system
    replays it."""
    return case if case.graph_contract in contracts else replace(case, graph_contract=contracts[0])


def with_draft_width(case: Case) -> Case:
    """`case` with every request of its verify and draft-extend batches at one draft width, where its algorithm is of
    EAGLE's family or CP is on: SGLang's EAGLE worker verifies and then extends its draft over each request's
    `--speculative-num-draft-tokens` tokens, one width for the server; and a CP server verifies at one width whatever
    its algorithm (SGLang refuses the ragged verify under CP, so such a server runs `SGLANG_RAGGED_VERIFY_MODE=static`:
    DSpark's `run_non_compact`). The width is the first such batch's first request's new tokens, at most
    `MAX_DRAFT_TOKENS` (`draft_extend_requests`' rule); other cases are returned as drawn."""
    wide = [b for b in case.batches if b.mode.is_draft_wide() and b.requests]
    if not (case.spec.is_eagle_family() or case.flags.cp_active) or not wide:
        return case
    width = min(wide[0].requests[0].extend_len, MAX_DRAFT_TOKENS)
    batches = tuple(replace(b, requests=tuple(Request(r.prefix_len, width) for r in b.requests))
                    if b.mode.is_draft_wide() else b for b in case.batches)
    return replace(case, batches=batches)


@st.composite
def _cases(draw, semantics: str, *, large: bool, budget: int, without: frozenset[str]) -> Case:
    if semantics not in _SPECS:
        raise InvalidArgument(f"semantics={semantics!r} is not one of: {', '.join(_SPECS)}")
    semantics = Semantics(semantics)
    closed = draw(st.sampled_from(closed_conditions(without)))  # first: the flags, the spec and the batches follow it
    specs_on = _switched_on(draw, _SPEC_FAMILIES)
    modes_on = _switched_on(draw, _MODE_GROUPS)
    kinds_on = _switched_on(draw, {k: {k} for k in MUTATION_KINDS})
    f = draw(flags(semantics, closed, tuple(k for k in KV_OFFLOAD if k not in without)))
    closing_specs = [s for s in _SPECS[semantics] if not publishes(s, semantics)]
    spec = draw(st.sampled_from(([s for s in closing_specs if s in specs_on] or closing_specs) if closed == "spec"
                                else [s for s in _SPECS[semantics] if publishes(s, semantics)]))
    # a closed condition decides alone: the first batch is an EXTEND that would publish without it (a
    # graph replay where the contract is what closes: those cases replay one bucket, below), or, where
    # the mode is what decides, a batch of another mode
    first_modes = {"open": None, "mode": _DECIDING_MODES}.get(closed, [ForwardMode.EXTEND])
    first_modes_on = None if closed == "mode" else modes_on
    contract = "bcg" if closed == "bcg" else "fresh"
    geometry = draw(st.sampled_from(["small"] * 14 + ["large"] * 3 + ["threshold"] * 3)) if large else "small"
    if geometry == "large":
        total = draw(token_total(min(MAX_TOKENS, budget)))
        dims = draw(large_dims(total, budget))
        reqs = draw(skewed_requests(total))
        # a second replay of the same bucket after a publishing one: the reused-bucket path, which is what
        # the breakable-graph contract changes; beyond the largest bucket both batches would run eager,
        # twice a long batch's cost for no replay
        reuse = graph_bucket(total) is not None and (closed == "bcg" or draw(_rare(4)))
        first = draw(batch(hisparse=f.hisparse, reqs=reqs, modes=[ForwardMode.EXTEND] if reuse else first_modes,
                           modes_on=first_modes_on, kinds_on=kinds_on))
        batches = [first]
        if reuse:
            second = draw(batch(hisparse=f.hisparse, reqs=first.requests, modes=_SECOND_MODES, kinds_on=kinds_on))
            batches = [replace(first, graph=True), replace(second, graph=True)]
        return Case(semantics=semantics, spec=spec, flags=f, dims=dims, batches=tuple(batches),
                    graph_contract=contract, data_seed=draw(st.integers(0, 2**16)))
    if geometry == "threshold":
        # SGLang's real threshold, with every gate open so the snapshot's decision is published.
        f = Flags(SGLANG_ENABLE_PREFILL_WAR_READ_DONE=True, SGLANG_OPT_FLASHMLA_SPARSE_PREFILL=False)
        spec = draw(st.sampled_from([S.DFLASH, S.DSPARK] + ([] if semantics.dflash_family_only else [S.NONE])))
        return Case(semantics=semantics, spec=spec, flags=f, dims=THRESHOLD_DIMS,
                    batches=(draw(threshold_batch(hisparse=f.hisparse)),), data_seed=draw(st.integers(0, 2**16)))
    dims = draw(small_dims())
    # Graph replays of one geometry, back to back: the bucket's captured metadata is reused, and a
    # batch that does not publish follows one that did (the mailbox must have been cleared). Both need
    # a first batch that publishes, an EXTEND; one or two replays follow it, each a chance for both.
    # The breakable-graph contract changes only how a bucket's metadata is reused: its cases replay.
    # Steps that leave state behind (issue 30): an idle step between two batches (its forward must hold nothing
    # of the batch before), and replays that change bucket and come back (A, B, A: the first bucket's captured
    # metadata and chunk cache must not carry over).
    shape = (draw(st.sampled_from(["replay_reuse", "bucket_change"])) if closed == "bcg"
             else draw(st.sampled_from(["single", "pair", "idle_step"])) if closed == "mode"
             else draw(st.sampled_from(["single", "replay_reuse", "replay_reuse", "pair", "idle_step", "bucket_change"])))
    replays = shape in ("replay_reuse", "bucket_change")
    first = draw(batch(hisparse=f.hisparse, reqs=draw(REPLAYABLE) if replays else None,
                       modes=[ForwardMode.EXTEND] if replays else first_modes, modes_on=first_modes_on,
                       kinds_on=kinds_on))
    batches = [first]
    if shape == "replay_reuse":
        later = draw(st.lists(batch(hisparse=f.hisparse, reqs=first.requests, modes=_SECOND_MODES, kinds_on=kinds_on),
                              min_size=1, max_size=2))
        batches = [replace(b, graph=True) for b in (first, *later)]
    elif shape == "bucket_change":
        total = sum(r.extend_len for r in first.requests)
        # one request more, whose tokens carry the batch past the first one's bucket into the next
        grown = first.requests + (Request(draw(st.integers(0, 40)), graph_bucket(total) - total + draw(st.integers(1, 4))),)
        other = draw(batch(hisparse=f.hisparse, reqs=grown, modes=_SECOND_MODES, kinds_on=kinds_on))
        back = draw(batch(hisparse=f.hisparse, reqs=first.requests, modes=[ForwardMode.EXTEND], kinds_on=kinds_on))
        batches = [replace(b, graph=True) for b in (first, other, back)]
    elif shape == "pair":
        batches.append(draw(batch(hisparse=f.hisparse, modes_on=modes_on, kinds_on=kinds_on)))
    elif shape == "idle_step":
        batches.append(draw(batch(hisparse=f.hisparse, modes=[ForwardMode.IDLE], kinds_on=kinds_on)))
        batches.append(draw(batch(hisparse=f.hisparse, reqs=first.requests or None, modes_on=modes_on,
                                  kinds_on=kinds_on)))
    if f.cp_active and draw(_rare(3)):
        # a step of fewer tokens than CP ranks, which a CP server runs whole (`Flags.cp_shards`): its plan, snapshot
        # and publish are those of a server without CP, which a gate asked of the server instead would lose
        below = (Request(draw(st.integers(0, 40)), CP_SIZE - 1),)
        batches.append(draw(batch(hisparse=f.hisparse, reqs=below, modes=[ForwardMode.EXTEND], kinds_on=kinds_on)))
    return Case(semantics=semantics, spec=spec, flags=f, dims=dims, batches=tuple(batches),
                graph_contract=contract,
                delay_cycles=draw(st.sampled_from(DELAYS)),
                data_seed=draw(st.integers(0, 2**16)))


def schedules():
    """The simulator's policy for one example: adversarial, or a seeded random interleaving."""
    return st.one_of(st.just("adversarial"), st.integers(0, 2**16).map(lambda s: f"random:{s}"))


SEED_DELAY_CYCLES = 50_000_000  # about 25 ms on an H200: the race gates' deadline after the event


def seed_cases(semantics: str, without: frozenset[str] = frozenset(),
               dims: tuple[tuple[str, object], ...] = (), contracts: tuple[str, ...] = GRAPH_CONTRACTS) -> list[Case]:
    """The protocol's shapes (reference notes, section 6), tried before anything is drawn; `without`: leave out
    the cases that turn one of these switches on (the target's `cannot_run`), and take none of these paths (a
    HiSparse seed then prefills dense); `dims`, `contracts`: the target's
    fixed sizes and graph contracts (`cases`).

    Random drawing reaches each of these, but only some of the time; a campaign that must not miss a
    whole class of bug starts from one case of each shape, then explores around and beyond them.
    """
    spec = S.DFLASH if Semantics(semantics).dflash_family_only else S.NONE
    base = Flags(SGLANG_ENABLE_PREFILL_WAR_READ_DONE=True)
    mut = (Mutation("swa_clear", count=3), Mutation("req_to_token_rewrite"))
    two = (Request(9, 6), Request(2, 3))
    mixed = (Request(9, 6), Request(5, 1))
    decode = (Request(15, 1), Request(5, 1))

    def case(*batches, flags=base, contract="fresh", spec=spec, dims=Dims()):
        return Case(semantics=semantics, spec=spec, flags=flags, dims=dims, batches=batches, graph_contract=contract,
                    delay_cycles=SEED_DELAY_CYCLES)

    extend = Batch(requests=two, mutations=mut)
    replay = Batch(requests=two, graph=True, mutations=mut)
    shapes = [
        case(extend),
        case(replay),
        case(replay, replay),
        case(replay, Batch(mode=ForwardMode.MIXED, requests=two, graph=True, mutations=mut), contract="bcg"),
        case(extend, Batch(mode=ForwardMode.DECODE, requests=decode, mutations=mut)),
        case(Batch(mode=ForwardMode.MIXED, requests=mixed, graph=True, mutations=mut)),
        case(Batch(mode=ForwardMode.MIXED, requests=mixed, mutations=mut)),  # eager: every release runs it as EXTEND
        # CP: an odd token count (the ranks' shares padded), and a request whose queries see a closed c128 block
        # beside one whose do not, so each rank's rows differ from the batch's first rows in every per-row plan field
        case(Batch(requests=(Request(140, 7), Request(9, 6)), mutations=mut),
             flags=Flags(SGLANG_ENABLE_PREFILL_WAR_READ_DONE=True, cp_active=True)),
        case(extend, flags=Flags(SGLANG_ENABLE_PREFILL_WAR_READ_DONE=True, hierarchical_cache=True)),
        # EAGLE: a prefill, then the draft extend after a verify (every request the server's draft width), replayed
        case(extend, Batch(mode=ForwardMode.DRAFT_EXTEND, requests=(Request(15, 3), Request(5, 3)), graph=True,
                           mutations=mut), spec=S.EAGLE),
        case(Batch(requests=(Request(0, 6000), Request(5, 5673)), mutations=mut),
             flags=Flags(SGLANG_ENABLE_PREFILL_WAR_READ_DONE=True, SGLANG_OPT_FLASHMLA_SPARSE_PREFILL=False),
             spec=S.DFLASH, dims=Dims(heads=1, head_dim=4, page_size=256, layer_ratios=(0,), index_align=8)),
    ]
    if Flags.HISPARSE_SPARSE_PREFILL in without:
        shapes = [c for c in map(dense_under_hisparse, shapes) if not takes_hisparse_sparse_prefill(c)]
    return [with_contract(with_dims(c, dims), contracts) for c in shapes
            if not any(getattr(c.flags, name) for name in without if name in Flags.GATES)]
