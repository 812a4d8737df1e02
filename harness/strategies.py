"""Hypothesis strategies for cases: small by default, with branches that reach SGLang's real sizes
(the 11673-token sparse threshold and the graph bucket edges) and shrink toward one or two requests."""

from __future__ import annotations

from hypothesis import strategies as st

from harness.case import MUTATION_KINDS, Batch, Case, Dims, Flags, Mutation, Request
from harness.errors import InvalidArgument
from harness.model.enums import ForwardMode, SpeculativeAlgorithm
from harness.model.metadata import _LARGE_INDEXER_QUERY_THRESHOLD

S = SpeculativeAlgorithm
_SPECS = {
    "0.5.23": [S.NONE, S.NONE, S.DFLASH, S.DSPARK, S.EAGLE, S.EAGLE3, S.NEXTN, S.STANDALONE, S.NGRAM],
    "pr": [S.DFLASH, S.DFLASH, S.DSPARK, S.NONE, S.EAGLE, S.NEXTN, S.NGRAM],
}
_MODES = [ForwardMode.EXTEND] * 8 + [ForwardMode.MIXED, ForwardMode.MIXED, ForwardMode.DECODE,
                                    ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND, ForwardMode.IDLE]
_SECOND_MODES = [ForwardMode.EXTEND, ForwardMode.MIXED, ForwardMode.MIXED, ForwardMode.DECODE,
                 ForwardMode.TARGET_VERIFY]
_LAYERS = [(0, 4, 128), (0, 4), (4,), (0,), (128, 0)]


def _rare(weight: int = 8):
    """False most of the time: a switch that closes a gate should not hide every other path."""
    return st.sampled_from([False] * (weight - 1) + [True])


_GATES = [None] * 5 + ["cp_active", "hisparse", "hierarchical_cache", "hicache_storage", "lmcache",
                      "SGLANG_FORCE_COARSE_WAR_BARRIER"]


@st.composite
def flags(draw, semantics: str) -> Flags:
    """At most one gate switch on, so that each gate is often drawn alone and half the cases keep all open."""
    enable = draw(st.sampled_from([True] * 6 + [None, False]) if semantics == "pr"
                  else st.sampled_from([None] * 6 + [True, False]))
    gate = draw(st.sampled_from(_GATES))
    return Flags(SGLANG_ENABLE_PREFILL_WAR_READ_DONE=enable,
                 SGLANG_OPT_FLASHMLA_SPARSE_PREFILL=draw(st.sampled_from([True, True, False])), **({gate: True} if gate else {}))


@st.composite
def mutations(draw, *, hisparse: bool) -> tuple[Mutation, ...]:
    kinds = [k for k in MUTATION_KINDS if k != "hisparse_evict" or hisparse]
    out = draw(st.lists(st.builds(
        Mutation, kind=st.sampled_from(kinds), target=st.sampled_from(["batch", "batch", "batch", "other"]),
        count=st.integers(1, 6), poison=_rare(4)), min_size=1, max_size=3))
    return tuple(out)


def requests(max_requests: int = 4, max_prefix: int = 48, max_extend: int = 24):
    return st.lists(st.builds(Request, prefix_len=st.integers(0, max_prefix), extend_len=st.integers(1, max_extend)),
                    min_size=1, max_size=max_requests).map(tuple)


@st.composite
def batch(draw, *, hisparse: bool, reqs=None, modes=None) -> Batch:
    mode = draw(st.sampled_from(modes or _MODES))
    if reqs is None:
        reqs = draw(st.one_of(requests(), requests(max_requests=2, max_prefix=300, max_extend=40)))
    muts = draw(mutations(hisparse=hisparse))
    if mode is ForwardMode.IDLE:  # nothing in flight: the scheduler still rewrites rows of other requests
        reqs = ()
        muts = (Mutation("req_to_token_rewrite", target="other"),)
    elif mode is ForwardMode.MIXED and all(r.extend_len > 1 for r in reqs):
        reqs = reqs + (Request(draw(st.integers(1, 40)), 1),)  # a running decode request mixed in
    return Batch(mode=mode, requests=reqs, graph=draw(st.booleans()), mutations=muts)


@st.composite
def threshold_batch(draw, *, hisparse: bool) -> Batch:
    """Exactly around SGLang's sparse threshold, where the snapshot and the forward must agree."""
    total = _LARGE_INDEXER_QUERY_THRESHOLD + draw(st.integers(-1, 1))
    first = draw(st.integers(1, total - 1))
    return Batch(mode=ForwardMode.EXTEND, requests=(Request(0, first), Request(draw(st.integers(0, 8)), total - first)),
                 graph=False, mutations=draw(mutations(hisparse=hisparse)))


@st.composite
def cases(draw, semantics: str = "0.5.23", *, large: bool = True) -> Case:
    """A case; `large` lets a few examples reach the real 11673-token threshold."""
    if semantics not in _SPECS:
        raise InvalidArgument(f"semantics={semantics!r} is not one of: {', '.join(_SPECS)}")
    f = draw(flags(semantics))
    spec = draw(st.sampled_from(_SPECS[semantics]))
    if large and draw(_rare(8)):
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
    first = draw(batch(hisparse=f.hisparse))
    batches = [first]
    if shape == "replay_reuse" and first.requests:
        # Graph replays of one geometry, back to back: the bucket's captured metadata is reused, and
        # a batch that does not publish follows one that did (the mailbox must have been cleared).
        first = Batch(mode=first.mode, requests=first.requests, graph=True, mutations=first.mutations)
        second = draw(batch(hisparse=f.hisparse, reqs=first.requests, modes=_SECOND_MODES))
        batches = [first, Batch(mode=second.mode, requests=second.requests, graph=True, mutations=second.mutations)]
    elif shape == "pair":
        batches.append(draw(batch(hisparse=f.hisparse)))
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
