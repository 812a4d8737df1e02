"""Contract cases: the five tests of PR #35947 and the invariants of the reference notes (section 6),
for both semantics. Each contract also has a test that breaks the reference in that one way and
shows the contract fails, naming the broken rule."""

from __future__ import annotations

import contextlib

import pytest

from harness.case import Batch, Case, Dims, Flags, Request
from harness.device import make_device
from harness.engine import run_case
from harness.model.enums import ForwardMode, SharedReadEnds, SpeculativeAlgorithm
from harness.model.metadata import LARGE_INDEXER_QUERY_THRESHOLD
from harness.mutants.contract_probes import flag_set_only_after_successful_build
from harness.mutants.corpus import mutant_target
from harness.oracles.float64 import float64_oracle
from harness.policy import graph_bucket
from harness.targets import ReferenceTarget
from harness.targets.protocol import Publish, Snapshot, first, noted
from harness.world import PoolSizes, build_world

S = SpeculativeAlgorithm
DEVICE = "cpu"


@pytest.fixture(autouse=True)
def _on_the_chosen_device(harness_device):
    """The same contract cases run on CUDA tensors with --harness-device cuda."""
    global DEVICE
    DEVICE = harness_device


@contextlib.contextmanager
def open_session(case, target=None):
    """A session with its first batch loaded, and torch's current stream the device's forward stream
    for the block, as the engine loads (`load_batch`) and steps a case. On torch's default stream the
    load and the metadata's host-staged index tensors are not ordered before the kernels the device
    issues on its forward stream (PyTorch's streams do not wait for the default one). On the H200 the
    11674-token chunk-cache build failed with a device-side out-of-bounds index, which is what its
    gathers give when they read `req_to_token` or its staged positions before the copies land."""
    target = target or ReferenceTarget()
    device = make_device(DEVICE)
    session = target.open(case, device)
    with device.stream(device.forward_stream):
        yield session, device, session.load(build_world(case, 0, PoolSizes.for_case(case), device.torch_device))


def pr_case(spec=S.DFLASH, **batch):
    return Case(semantics="pr", spec=spec, flags=Flags(SGLANG_ENABLE_PREFILL_WAR_READ_DONE=True),
                batches=(Batch(requests=(Request(5, 6), Request(0, 3)), **batch),))


def big_case(semantics: str, tokens: int) -> Case:
    flags = Flags(SGLANG_ENABLE_PREFILL_WAR_READ_DONE=True, SGLANG_OPT_FLASHMLA_SPARSE_PREFILL=False)
    dims = Dims(heads=1, head_dim=4, page_size=256, layer_ratios=(0,))
    return Case(semantics=semantics, spec=S.DFLASH, flags=flags, dims=dims,
                batches=(Batch(requests=(Request(0, tokens),)),))


# -- the five tests of PR #35947 -------------------------------------------------------------------------

def test_prefill_snapshot_declares_pre_replay_boundary():
    with open_session(pr_case()) as (session, device, fb):
        backend = session.model_runner.attn_backend
        backend.init_forward_metadata(fb)
        backend.prepare_prefill_shared_read_snapshot(fb, num_qo_tokens=fb.num_tokens)
        device.synchronize()
        assert backend.shared_read_ends(ForwardMode.EXTEND) is SharedReadEnds.PRE_REPLAY


@pytest.mark.parametrize("semantics", ["pr", "0.5.23"])
@pytest.mark.parametrize("tokens,built", [(LARGE_INDEXER_QUERY_THRESHOLD, False),
                                          (LARGE_INDEXER_QUERY_THRESHOLD + 1, True)])
def test_snapshot_builds_cache_only_for_sparse_prefill(semantics, tokens, built):
    with open_session(big_case(semantics, tokens)) as (session, device, fb):
        backend = session.model_runner.attn_backend
        backend.init_forward_metadata(fb)
        if semantics == "pr":
            backend.prepare_prefill_shared_read_snapshot(fb, num_qo_tokens=tokens)
        else:
            assert backend.resolve_prefill_shared_read_ends(fb, num_qo_tokens=tokens) is SharedReadEnds.PRE_REPLAY
        device.synchronize()
        assert (backend.forward_metadata.sparse_prefill_cache is not None) is built


def test_sparse_prefill_snapshot_marks_success_only_after_build():
    with open_session(pr_case()) as (session, device, fb):
        backend = session.model_runner.attn_backend
        backend.init_forward_metadata(fb)

        def failing_build(*args, **kwargs):
            raise RuntimeError("injected build failure")

        backend._build_sparse_prefill_chunk_cache = failing_build
        with pytest.raises(RuntimeError, match="injected"):
            backend.prepare_prefill_shared_read_snapshot(fb, num_qo_tokens=fb.num_tokens)
        assert backend.forward_metadata.prefill_shared_reads_snapshotted is False
        assert backend.shared_read_ends(ForwardMode.EXTEND) is SharedReadEnds.UNKNOWN


@pytest.mark.parametrize("semantics", ["pr", "0.5.23"])
def test_replay_snapshot_uses_padded_token_count(semantics):
    case = pr_case(graph=True) if semantics == "pr" else Case(batches=(Batch(requests=(Request(5, 6), Request(0, 3)), graph=True),))
    result = run_case(ReferenceTarget(), case, DEVICE)
    snapshot = first(result.overlapped.notes[0], Snapshot)
    assert snapshot.num_qo_tokens == 12  # 9 tokens replay at the 12-token bucket
    assert not result.findings


@pytest.mark.parametrize("spec", [S.DFLASH, S.DSPARK])
@pytest.mark.parametrize("semantics", ["pr", "0.5.23"])
def test_dflash_family_target_prefill_publishes(semantics, spec):
    case = Case(semantics=semantics, spec=spec, flags=Flags(SGLANG_ENABLE_PREFILL_WAR_READ_DONE=True),
                batches=(Batch(requests=(Request(3, 5),)),))
    result = run_case(ReferenceTarget(), case, DEVICE)
    assert noted(result.overlapped.notes[0], Publish)
    assert not result.findings


# -- the invariants, with the bug that breaks each one --------------------------------------------------

GATES = [
    ("EAGLE has a later reader", dict(spec=S.EAGLE), False),
    ("NEXTN/MTP has a later reader", dict(spec=S.NEXTN), False),
    ("NGRAM is not audited", dict(spec=S.NGRAM), False),
    ("plain EXTEND publishes", dict(), True),
    ("DFLASH publishes", dict(spec=S.DFLASH), True),
    ("CP active", dict(flags=Flags(cp_active=True)), False),
    ("HiSparse", dict(flags=Flags(hisparse=True)), False),
    ("hierarchical cache", dict(flags=Flags(hierarchical_cache=True)), False),
    ("LMCache", dict(flags=Flags(lmcache=True)), False),
    ("forced coarse barrier", dict(flags=Flags(SGLANG_FORCE_COARSE_WAR_BARRIER=True)), False),
    ("read-done flag off", dict(flags=Flags(SGLANG_ENABLE_PREFILL_WAR_READ_DONE=False)), False),
]


@pytest.mark.parametrize("rule,fields,publishes", GATES, ids=[g[0] for g in GATES])
def test_publish_gates(rule, fields, publishes):
    case = Case(batches=(Batch(requests=(Request(7, 5),)),), **fields)
    result = run_case(ReferenceTarget(), case, DEVICE)
    assert (noted(result.overlapped.notes[0], Publish)) is publishes, rule
    assert not result.findings


ON = Flags(SGLANG_ENABLE_PREFILL_WAR_READ_DONE=True)
PR_GATES = [
    ("DFLASH publishes", dict(spec=S.DFLASH), True),
    ("DSPARK publishes", dict(spec=S.DSPARK), True),
    ("plain EXTEND does not (PR-era: DFLASH family only)", dict(spec=S.NONE), False),
    ("EAGLE does not", dict(spec=S.EAGLE), False),
    ("the flag is off by default", dict(spec=S.DFLASH, flags=Flags()), False),
    ("CP active", dict(spec=S.DFLASH, flags=Flags(SGLANG_ENABLE_PREFILL_WAR_READ_DONE=True, cp_active=True)), False),
    ("hierarchical cache", dict(spec=S.DFLASH, flags=Flags(SGLANG_ENABLE_PREFILL_WAR_READ_DONE=True,
                                                              hierarchical_cache=True)), False),
]


@pytest.mark.parametrize("rule,fields,publishes", PR_GATES, ids=[g[0] for g in PR_GATES])
def test_pr_era_publish_gates(rule, fields, publishes):
    case = Case(semantics="pr", batches=(Batch(requests=(Request(7, 5),)),), **{"flags": ON, **fields})
    result = run_case(ReferenceTarget(), case, DEVICE)
    assert (noted(result.overlapped.notes[0], Publish)) is publishes, rule
    assert not result.findings


@pytest.mark.parametrize("mode", [ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND])
def test_only_extend_publishes(mode):
    requests = (Request(7, 1), Request(4, 1)) if mode is ForwardMode.DECODE else (Request(7, 5), Request(4, 1))
    case = Case(batches=(Batch(mode=mode, requests=requests),))
    result = run_case(ReferenceTarget(), case, DEVICE)
    assert not noted(result.overlapped.notes[0], Publish)
    assert not result.findings


MIXED = (Request(7, 5), Request(4, 1))


@pytest.mark.parametrize("semantics,graph,cp,publishes", [
    ("0.5.23", False, False, True),   # EagerRunner.execute runs a mixed batch as EXTEND
    ("0.5.23", True, False, False),   # graph replay keeps MIXED
    ("0.5.23", False, True, False),   # CP keeps MIXED (and closes the gate anyway)
    ("pr", False, False, True),       # so does every PR-era release's eager runner (0.5.19 on)
    ("pr", True, False, False),
])
def test_mixed_publishes_only_where_it_runs_as_extend(semantics, graph, cp, publishes):
    case = Case(semantics=semantics, spec=S.DFLASH,
                flags=Flags(SGLANG_ENABLE_PREFILL_WAR_READ_DONE=True, cp_active=cp),
                batches=(Batch(mode=ForwardMode.MIXED, requests=MIXED, graph=graph),))
    result = run_case(ReferenceTarget(), case, DEVICE)
    assert (noted(result.overlapped.notes[0], Publish)) is publishes
    assert not result.findings


def test_bcg_replay_stays_coarse():
    case = Case(graph_contract="bcg", batches=(Batch(requests=(Request(7, 5),), graph=True),))
    result = run_case(ReferenceTarget(), case, DEVICE)
    assert not noted(result.overlapped.notes[0], Publish)
    assert not result.findings


def test_padded_rows_are_empty_and_point_at_the_dummy_slot():
    case = Case(batches=(Batch(requests=(Request(7, 5), Request(2, 4)), graph=True),))
    with open_session(case) as (session, device, fb):
        padded = session.model_runner.graph_runner._pad(fb, 12)
        assert padded.out_cache_loc[9:].tolist() == [0, 0, 0]
        assert padded.positions[9:].tolist() == [0, 0, 0]
        assert padded.row_req[9:] == [1, 1, 1]
        backend = session.model_runner.attn_backend
        backend.init_forward_metadata(padded)
        backend.resolve_prefill_shared_read_ends(padded, num_qo_tokens=12)
        device.synchronize()
        cache = backend.forward_metadata.sparse_prefill_cache
        assert (cache.c0_combined_indices[9:] == -1).all() and (cache.c0_combined_lens[9:] == 0).all()
        assert backend.forward_metadata.core_attn_metadata.seq_lens_casual[9:].tolist() == [1, 1, 1]


def test_graph_refuses_beyond_twice_the_padding():
    assert graph_bucket(9) == 12 and graph_bucket(33) == 48 and graph_bucket(2049) is None
    assert graph_bucket(17) == 20


def test_copy_and_refresh_reset_the_cache():
    with open_session(Case()) as (session, device, fb):
        backend = session.model_runner.attn_backend
        for method in ("copy_", "refresh_for_breakable_cuda_graph_replay_"):
            backend.init_forward_metadata(fb)
            backend.resolve_prefill_shared_read_ends(fb, num_qo_tokens=fb.num_tokens)
            meta = backend.forward_metadata
            meta.prefill_shared_reads_snapshotted = True
            other = type(meta)(backend.build_core_metadata(fb))
            getattr(meta, method)(other)
            device.synchronize()
            assert meta.sparse_prefill_cache is None and not meta.prefill_shared_reads_snapshotted, method


# Each contract fires on the one bug that breaks it (the corpus mutant), naming the rule.
FIRES = [
    ("snapshot_skipped", Case(batches=(Batch(requests=(Request(0, 3),)),)), "read-after-publish"),
    ("graph_snapshot_real_count", Case(batches=(Batch(requests=(Request(5, 6), Request(0, 3)), graph=True),)),
     "target-raised"),
    ("eagle_publishes", Case(spec=S.EAGLE, batches=(Batch(requests=(Request(3, 5),)),)), "unexpected-publish"),
    ("mixed_publishes", Case(batches=(Batch(mode=ForwardMode.MIXED, requests=(Request(3, 5), Request(6, 1)),
                                            graph=True),)), "unexpected-publish"),
    ("fast_path_lost", Case(batches=(Batch(requests=(Request(3, 5),)),)), "missed-fast-path"),
    ("offload_gate_missing", Case(flags=Flags(hierarchical_cache=True), batches=(Batch(requests=(Request(3, 5),)),)),
     "unexpected-publish"),
    ("event_on_wrong_stream", Case(batches=(Batch(requests=(Request(3, 5),)),)), "event-on-wrong-stream"),
    ("copy_keeps_cache", Case(batches=(Batch(requests=(Request(3, 5),), graph=True),) * 2), "metadata-not-reset"),
    ("refresh_keeps_cache", Case(graph_contract="bcg", batches=(
        Batch(mode=ForwardMode.MIXED, requests=(Request(3, 5), Request(2, 1)), graph=True),) * 2), "metadata-not-reset"),
    ("missing_token_to_kv_pool", Case(batches=(Batch(requests=(Request(3, 5),)),)), "target-raised"),
]


@pytest.mark.parametrize("name,case,kind", FIRES, ids=[f[0] for f in FIRES])
def test_each_contract_fires_on_its_bug(name, case, kind):
    assert not run_case(ReferenceTarget(), case, DEVICE).findings
    findings = run_case(mutant_target(name), case, DEVICE).findings
    assert kind in {f.kind for f in findings}, [f"{f.oracle}/{f.kind}: {f.message}" for f in findings]


def test_flag_probe_passes_on_the_clean_reference_and_fires_on_the_pr_era_bug():
    assert flag_set_only_after_successful_build(ReferenceTarget()) is None
    assert "PRE_REPLAY" in flag_set_only_after_successful_build(mutant_target("pr_flag_before_build"))


def test_float64_oracle_matches_on_clean_and_fires_on_wrong_attention():
    case = Case(batches=(Batch(requests=(Request(140, 9), Request(3, 6))),))
    result = run_case(ReferenceTarget(), case, DEVICE)
    assert not result.findings
    result.barriered.outputs[0]["attention"][1, 3, 0, 0] += 1e-3
    assert [f.kind for f in float64_oracle(case, result.barriered)] == ["attention-mismatch"]
