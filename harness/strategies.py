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
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from harness.case import MUTATION_KINDS, Batch, Case, Dims, Flags, Mutation, Request
from harness.errors import InvalidArgument
from harness.model.enums import ForwardMode, SpeculativeAlgorithm
from harness.model.metadata import _LARGE_INDEXER_QUERY_THRESHOLD
from harness.model.runners import generate_prefill_cuda_graph_batch_sizes
from harness.policy import GRAPH_MAX_BS

S = SpeculativeAlgorithm
_SPECS = {
    "0.5.23": [S.NONE, S.NONE, S.DFLASH, S.DSPARK, S.EAGLE, S.EAGLE3, S.NEXTN, S.STANDALONE, S.NGRAM],
    "pr": [S.DFLASH, S.DFLASH, S.DSPARK, S.NONE, S.EAGLE, S.EAGLE3, S.NEXTN, S.STANDALONE, S.NGRAM],
}
# Swarm groups: a case switches each group on or off; a case that switches all off keeps all. The
# publishing specs (none and the DFLASH family) stay on: without them no batch publishes, and most
# bugs are in what publication lets the scheduler do.
_SPEC_FAMILIES = {"eagle": {S.EAGLE, S.EAGLE3, S.NEXTN, S.STANDALONE}, "ngram": {S.NGRAM}}
_PUBLISHING_SPECS = {S.NONE, S.DFLASH, S.DSPARK}
_MODE_GROUPS = {"extend": {ForwardMode.EXTEND}, "mixed": {ForwardMode.MIXED},
                "speculative": {ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND},
                "decode": {ForwardMode.DECODE, ForwardMode.IDLE}}

# tokens x layers x heads a drawn geometry may reach: `ci` reaches the threshold with one small layer,
# `nightly` real head counts (64) at a few thousand tokens.
PROFILE_BUDGETS = {"dev": 12_000, "ci": 12_000, "nightly": 2_000_000}
BUCKETS = generate_prefill_cuda_graph_batch_sizes(GRAPH_MAX_BS)
MAX_TOKENS = 32_768
MAX_PREFIX = 16_384
_DECADES = [(1, 9), (10, 99), (100, 999), (1000, 9999), (10_000, MAX_TOKENS)]
_MODES = [ForwardMode.EXTEND] * 8 + [ForwardMode.MIXED, ForwardMode.MIXED, ForwardMode.DECODE,
                                    ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND, ForwardMode.IDLE]
_SECOND_MODES = [ForwardMode.EXTEND, ForwardMode.MIXED, ForwardMode.MIXED, ForwardMode.DECODE,
                 ForwardMode.TARGET_VERIFY]
_LAYERS = [(0, 4, 128), (0, 4), (4,), (0,), (128, 0)]


def _switched_on(draw, groups: dict) -> set:
    """The union of the groups this case switches on (all of them when it switches none on)."""
    on = [members for members in groups.values() if draw(st.booleans())]
    return set().union(*on) if on else set().union(*groups.values())


def _rare(weight: int = 8):
    """False most of the time: a switch that closes a gate should not hide every other path."""
    return st.sampled_from([False] * (weight - 1) + [True])


_GATES = [None] * 5 + ["cp_active", "hisparse", "hierarchical_cache", "hicache_storage", "lmcache",
                      "SGLANG_FORCE_COARSE_WAR_BARRIER"]


@st.composite
def flags(draw, semantics: str, *, gates_on: bool = True, hisparse_wanted: bool = False) -> Flags:
    """At most one gate switch on, so that each gate is often drawn alone and half the cases keep all
    open; `gates_on` False (the swarm switched the gates off) keeps them all open. `hisparse_wanted`:
    the swarm switched HiSparse eviction on, which only a HiSparse case can run."""
    enable = draw(st.sampled_from([True] * 6 + [None, False]) if semantics == "pr"
                  else st.sampled_from([None] * 6 + [True, False]))
    # the swarm switched the gates on: one is closed in most cases, each about as often as the others
    gate = draw(st.sampled_from(_GATES[4:] + ["hisparse"] * (4 if hisparse_wanted else 0))) if gates_on else None
    return Flags(SGLANG_ENABLE_PREFILL_WAR_READ_DONE=enable,
                 SGLANG_OPT_FLASHMLA_SPARSE_PREFILL=draw(st.sampled_from([True, True, False])), **({gate: True} if gate else {}))


@st.composite
def mutations(draw, *, hisparse: bool, kinds_on=MUTATION_KINDS) -> tuple[Mutation, ...]:
    kinds = ([k for k in MUTATION_KINDS if (k != "hisparse_evict" or hisparse) and k in kinds_on]
             or ["req_to_token_rewrite"])
    out = draw(st.lists(st.builds(
        Mutation, kind=st.sampled_from(kinds), target=st.sampled_from(["batch", "batch", "batch", "other"]),
        count=st.integers(1, 6), poison=_rare(4)), min_size=1, max_size=3))
    return tuple(out)


def requests(max_requests: int = 4, max_prefix: int = 48, max_extend: int = 24):
    return st.lists(st.builds(Request, prefix_len=st.integers(0, max_prefix), extend_len=st.integers(1, max_extend)),
                    min_size=1, max_size=max_requests).map(tuple)


@st.composite
def batch(draw, *, hisparse: bool, reqs=None, modes=None, modes_on=None, kinds_on=MUTATION_KINDS) -> Batch:
    modes = modes or _MODES
    mode = draw(st.sampled_from([m for m in modes if modes_on is None or m in modes_on] or modes))
    if reqs is None:
        reqs = draw(st.one_of(requests(), requests(max_requests=2, max_prefix=300, max_extend=40)))
    muts = draw(mutations(hisparse=hisparse, kinds_on=kinds_on))
    if mode is ForwardMode.IDLE:  # nothing in flight: the scheduler still rewrites rows of other requests
        reqs = ()
        muts = (Mutation("req_to_token_rewrite", target="other"),)
    elif mode is ForwardMode.MIXED and all(r.extend_len > 1 for r in reqs):
        reqs = reqs + (Request(draw(st.integers(1, 40)), 1),)  # a running decode request mixed in
    return Batch(mode=mode, requests=reqs, graph=draw(st.booleans()), mutations=muts)


@st.composite
def token_total(draw, limit: int) -> int:
    """A batch's token count: one decade drawn evenly, then a count in it; or a graph bucket edge."""
    if draw(st.booleans()):
        low, high = draw(st.sampled_from([d for d in _DECADES if d[0] <= limit]))
        total = draw(st.integers(low, min(high, limit)))
    else:
        total = draw(st.sampled_from(BUCKETS + [_LARGE_INDEXER_QUERY_THRESHOLD])) + draw(st.sampled_from([-1, 0, 1]))
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
    layers = draw(st.sampled_from([lr for lr in _LAYERS if total * len(lr) <= budget] or [(0,)]))
    head_options = [h for h in (1, 2, 64) if total * len(layers) * h <= budget] or [1]
    heads = draw(st.sampled_from(head_options))
    return Dims(heads=heads, head_dim=512 if heads == 64 else draw(st.sampled_from([4, 8])),
                swa_window=draw(st.sampled_from([8, 128])), index_topk=draw(st.sampled_from([4, 512])),
                index_dim=4, page_size=draw(st.sampled_from([64, 128, 256])), layer_ratios=layers,
                index_align=draw(st.sampled_from([8, 128])))


@st.composite
def threshold_batch(draw, *, hisparse: bool) -> Batch:
    """Exactly around SGLang's sparse threshold, where the snapshot and the forward must agree."""
    total = _LARGE_INDEXER_QUERY_THRESHOLD + draw(st.sampled_from([0, -1, 1]))
    first = draw(st.integers(1, total - 1))
    return Batch(mode=ForwardMode.EXTEND, requests=(Request(0, first), Request(draw(st.integers(0, 8)), total - first)),
                 graph=False, mutations=draw(mutations(hisparse=hisparse)))


@st.composite
def cases(draw, semantics: str = "0.5.23", *, large: bool = True, budget: int = PROFILE_BUDGETS["ci"]) -> Case:
    """A case; `large` lets some examples reach SGLang's sizes (the threshold, the bucket edges, every
    decade of tokens) within `budget` (tokens x layers x heads)."""
    if semantics not in _SPECS:
        raise InvalidArgument(f"semantics={semantics!r} is not one of: {', '.join(_SPECS)}")
    specs_on = _switched_on(draw, _SPEC_FAMILIES) | _PUBLISHING_SPECS
    modes_on = _switched_on(draw, _MODE_GROUPS)
    kinds_on = _switched_on(draw, {k: {k} for k in MUTATION_KINDS})
    gates_on = draw(st.sampled_from([False, False, True]))  # a third of the cases close a gate
    f = draw(flags(semantics, gates_on=gates_on, hisparse_wanted="hisparse_evict" in kinds_on))
    spec = draw(st.sampled_from([s for s in _SPECS[semantics] if s in specs_on] or _SPECS[semantics]))
    geometry = draw(st.sampled_from(["small"] * 14 + ["large"] * 3 + ["threshold"] * 2)) if large else "small"
    if geometry == "large":
        total = draw(token_total(min(MAX_TOKENS, budget)))
        dims = draw(large_dims(total, budget))
        reqs = draw(skewed_requests(total))
        first = draw(batch(hisparse=f.hisparse, reqs=reqs, modes_on=modes_on, kinds_on=kinds_on))
        batches = [first]
        if first.requests and draw(_rare(4)):  # a second replay of the same bucket: the reused-bucket path
            second = draw(batch(hisparse=f.hisparse, reqs=first.requests, modes=_SECOND_MODES, kinds_on=kinds_on))
            batches = [replace(first, graph=True), replace(second, graph=True)]
        return Case(semantics=semantics, spec=spec, flags=f, dims=dims, batches=tuple(batches),
                    graph_contract=draw(st.sampled_from(["fresh", "bcg"])), data_seed=draw(st.integers(0, 2**16)))
    if geometry == "threshold":
        # SGLang's real threshold, with every gate open so the snapshot's decision is published.
        f = Flags(SGLANG_ENABLE_PREFILL_WAR_READ_DONE=True, SGLANG_OPT_FLASHMLA_SPARSE_PREFILL=False)
        spec = draw(st.sampled_from([S.DFLASH, S.DSPARK] + ([S.NONE] if semantics != "pr" else [])))
        dims = Dims(heads=1, head_dim=4, swa_window=8, index_topk=4, index_dim=4, page_size=256, layer_ratios=(0,),
                    index_align=8)
        return Case(semantics=semantics, spec=spec, flags=f, dims=dims,
                    batches=(draw(threshold_batch(hisparse=f.hisparse)),), data_seed=draw(st.integers(0, 2**16)))
    dims = Dims(
        heads=draw(st.sampled_from([1, 2])), head_dim=draw(st.sampled_from([4, 8])),
        swa_window=draw(st.sampled_from([4, 8, 16])), index_topk=draw(st.sampled_from([2, 4])),
        index_dim=4, page_size=draw(st.sampled_from([1, 2, 4, 8, 16])), layer_ratios=draw(st.sampled_from(_LAYERS)),
    )
    shape = draw(st.sampled_from(["single", "replay_reuse", "replay_reuse", "pair"]))
    first = draw(batch(hisparse=f.hisparse, modes_on=modes_on, kinds_on=kinds_on))
    batches = [first]
    if shape == "replay_reuse" and first.requests:
        # Graph replays of one geometry, back to back: the bucket's captured metadata is reused, and
        # a batch that does not publish follows one that did (the mailbox must have been cleared).
        first = Batch(mode=first.mode, requests=first.requests, graph=True, mutations=first.mutations)
        second = draw(batch(hisparse=f.hisparse, reqs=first.requests, modes=_SECOND_MODES, kinds_on=kinds_on))
        batches = [first, Batch(mode=second.mode, requests=second.requests, graph=True, mutations=second.mutations)]
    elif shape == "pair":
        batches.append(draw(batch(hisparse=f.hisparse, modes_on=modes_on, kinds_on=kinds_on)))
    return Case(semantics=semantics, spec=spec, flags=f, dims=dims, batches=tuple(batches),
                graph_contract=draw(st.sampled_from(["fresh", "bcg"])),
                delay_cycles=draw(st.sampled_from([0, 20_000_000, 100_000_000])),
                data_seed=draw(st.integers(0, 2**16)))


def schedules():
    """The simulator's policy for one example: adversarial, or a seeded random interleaving."""
    return st.one_of(st.just("adversarial"), st.integers(0, 2**16).map(lambda s: f"random:{s}"))


SEED_DELAY_CYCLES = 50_000_000  # about 25 ms on an H200: the forward sleeps right after the event


def seed_cases(semantics: str) -> list[Case]:
    """The protocol's shapes (reference notes, section 6), tried before anything is drawn.

    Random drawing reaches each of these, but only some of the time; a campaign that must not miss a
    whole class of bug starts from one case of each shape, then explores around and beyond them.
    """
    spec = S.DFLASH if semantics == "pr" else S.NONE
    base = Flags(SGLANG_ENABLE_PREFILL_WAR_READ_DONE=True)
    mut = (Mutation("swa_clear", count=3), Mutation("req_to_token_rewrite"))
    two = (Request(9, 6), Request(2, 3))
    mixed = (Request(9, 6), Request(5, 1))

    def case(*batches, flags=base, contract="fresh", spec=spec, dims=Dims()):
        return Case(semantics=semantics, spec=spec, flags=flags, dims=dims, batches=batches, graph_contract=contract,
                    delay_cycles=SEED_DELAY_CYCLES)

    extend = Batch(requests=two, mutations=mut)
    replay = Batch(requests=two, graph=True, mutations=mut)
    return [
        case(extend),
        case(replay),
        case(replay, replay),
        case(replay, Batch(mode=ForwardMode.MIXED, requests=two, graph=True, mutations=mut), contract="bcg"),
        case(extend, Batch(mode=ForwardMode.DECODE, requests=mixed, mutations=mut)),
        case(Batch(mode=ForwardMode.MIXED, requests=mixed, graph=True, mutations=mut)),
        case(Batch(mode=ForwardMode.MIXED, requests=mixed, mutations=mut)),  # eager: 0.5.23 runs it as EXTEND
        case(extend, flags=Flags(SGLANG_ENABLE_PREFILL_WAR_READ_DONE=True, cp_active=True)),
        case(extend, flags=Flags(SGLANG_ENABLE_PREFILL_WAR_READ_DONE=True, hierarchical_cache=True)),
        case(extend, spec=S.EAGLE),
        case(Batch(requests=(Request(0, 6000), Request(5, 5673)), mutations=mut),
             flags=Flags(SGLANG_ENABLE_PREFILL_WAR_READ_DONE=True, SGLANG_OPT_FLASHMLA_SPARSE_PREFILL=False),
             spec=S.DFLASH, dims=Dims(heads=1, head_dim=4, page_size=256, layer_ratios=(0,), index_align=8)),
    ]
