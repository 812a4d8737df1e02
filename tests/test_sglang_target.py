"""`--target sglang`: the installed SGLang package's real code, judged by the harness's oracles.

Needs sglang 0.5.23 and its CPU import dependencies (see harness/sglang_target/__init__.py); skipped
without them. The cases run on `--harness-device` (cpu: the simulator, SGLang's Triton kernels
interpreted; cuda: compiled), so the kernels' mode is chosen before anything imports triton.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import textwrap
from types import SimpleNamespace

from harness.sglang_target.api import prepare_triton

prepare_triton()

import pytest  # noqa: E402

pytest.importorskip("sglang", reason="the sglang package is not installed: --target sglang needs "
                                     "`pip install --no-deps sglang==0.5.23` plus its CPU import deps")

import torch  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402

from harness.case import CP_SIZE, Batch, Case, Dims, Flags, Mutation, Request  # noqa: E402
from harness.device import SimDevice, make_device  # noqa: E402
from harness.engine import run_case  # noqa: E402
from harness.errors import EnvironmentBroken, InvalidArgument  # noqa: E402
from harness.model.enums import ForwardMode, SpeculativeAlgorithm  # noqa: E402
from harness.model.runners import ModelRunner  # noqa: E402
from harness.sglang_target.api import load_api  # noqa: E402
from harness.sglang_target import real_backend  # noqa: E402
from harness.sglang_target.platform import sglang_config  # noqa: E402
from harness.sglang_target.real_backend import fixed_dims  # noqa: E402
from harness.strategies import cases, seed_cases  # noqa: E402
from harness.targets import Classes, ReferenceTarget, TargetSpec  # noqa: E402
from harness.targets.protocol import (Forward, GraphReplay, LazyBuild, MetadataReuse, Planned, PlanRead, Publish,  # noqa: E402
                                      Snapshot)
from tests.test_sglang_releases import _counting  # noqa: E402

# The sizes the installed release's cases run at (0.5.23's backend asserts DSV4's page, head_dim and top-k).
FIXED_DIMS = tuple(fixed_dims(load_api()).items())
SGLANG = TargetSpec("sglang")
DIMS = dataclasses.replace(Dims(), **dict(FIXED_DIMS))


@pytest.fixture(scope="module")
def target():
    from harness.sglang_target import SglangTarget

    return SglangTarget()


def kinds(result):
    return [(f.oracle, f.kind) for f in result.findings]


def notes(result, kind):
    return [r for batch in result.overlapped.notes for r in batch if isinstance(r, kind)]


REWRITE = Mutation("req_to_token_rewrite")
FIXED = {
    "extend-sparse": Case(dims=DIMS, batches=(Batch(requests=(Request(3, 5), Request(0, 6)),
                                         mutations=(REWRITE, Mutation("swa_clear", count=3))),)),
    "extend-dense": Case(dims=DIMS, flags=Flags(SGLANG_OPT_FLASHMLA_SPARSE_PREFILL=False),
                         batches=(Batch(requests=(Request(9, 4),), mutations=(Mutation("swa_repoint", count=2),)),)),
    "dflash": Case(dims=DIMS, spec=SpeculativeAlgorithm.DFLASH,
                   batches=(Batch(requests=(Request(10, 7),), mutations=(Mutation("kv_realloc", count=2),)),)),
    "graph-bcg": Case(dims=DIMS, graph_contract="bcg",
                      batches=(Batch(requests=(Request(2, 5),), graph=True, mutations=(REWRITE,)),)),
}


def test_reports_the_installed_version_and_semantics(target):
    assert target.version == "0.5.23" and target.semantics == "0.5.23"
    assert "resolve_prefill_shared_read_ends" in target.description
    assert target.semantics_supported == ("0.5.23",) and target.name == "sglang-0.5.23"


def test_the_summary_lists_what_the_real_forward_runs_on_stood_in(target, harness_device):
    """Where an eager batch runs SGLang's forward (0.5.23, the CPU), the compiled code it reaches is stood in by
    an implementation of its contract, and the summary says so, each with where it is implemented."""
    rows = {row["module"]: row["reason"] for row in target.stand_ins}
    if harness_device != "cpu":  # SGLang's CUDA JIT kernels compile and run there; FlashMLA where its wheel loads
        assert not any("_jit_" in name for name in rows), rows
        assert ("flash_mla" in rows) != real_backend._flash_mla_loads(), rows
        return
    assert "harness/sglang_target/flash_mla.py" in rows["flash_mla"]
    assert "jit_kernels.py" in rows["sglang.kernels.ops.attention.dsv4.attn._jit_fused_store_module"]
    assert "jit_kernels.py" in rows["sglang.kernels.ops.attention.dsv4.compress._jit_compress_plan_module"]


def test_kernels_run_on_the_device_and_the_other_device_is_refused(target, harness_device):
    """One process defines SGLang's Triton kernels for one device kind; a session on the other is an
    environment error that names the TRITON_INTERPRET setting, not a Triton failure deep in a kernel."""
    from harness.sglang_target.api import RetiledKernel

    api = target.api
    assert api.kernels_on == harness_device, api.describe()
    api.check_device(harness_device)
    retiled = isinstance(api.mods["kernels"]._combine_topk_swa_indices_kernel, RetiledKernel)
    assert retiled == (harness_device == "cpu")  # the wide interpreter tile never replaces SGLang's GPU launch
    other = SimpleNamespace(kind="cuda") if harness_device == "cpu" else SimDevice()
    with pytest.raises(EnvironmentBroken, match="TRITON_INTERPRET") as info:
        target.open(Case(dims=DIMS, batches=(Batch(requests=(Request(3, 5),)),)), other)
    assert info.value.exit_code == 3


def test_dsv4_replays_its_prefill_graph_as_the_breakable_graph_only(target, harness_device):
    """0.5.22 removed the tc_piecewise prefill backend, and DSV4's breakable graph replays its captured metadata:
    the target has the `bcg` contract only, a campaign replays every drawn case under it, and a case that asks for
    a tc_piecewise (`fresh`) replay is refused, naming the field; an eager case of either contract runs."""
    assert target.graph_contracts == ("bcg",)
    replay = Batch(requests=(Request(2, 5),), graph=True, mutations=(REWRITE,))
    with pytest.raises(InvalidArgument, match="graph_contract='fresh': allowed: bcg "):
        target.open(Case(dims=DIMS, batches=(replay,)), make_device(harness_device))
    target.open(Case(dims=DIMS, batches=(dataclasses.replace(replay, graph=False),)), make_device(harness_device))
    drawn = []

    @settings(max_examples=30, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=cases(large=False, dims=FIXED_DIMS, contracts=target.graph_contracts))
    def draw(case):
        drawn.append(case)

    draw()
    assert {c.graph_contract for c in drawn} == {"bcg"}
    assert {c.graph_contract for c in seed_cases("0.5.23", contracts=target.graph_contracts)} == {"bcg"}


@pytest.mark.parametrize("name", list(FIXED))
def test_fixed_cases_run_clean_and_publish(target, name, harness_device):
    result = run_case(target, FIXED[name], harness_device, target_spec=SGLANG)
    assert result.findings == [], [f.message for f in result.findings]
    published = notes(result, Publish)
    if name == "graph-bcg":  # the captured-metadata replay builds no snapshot: the coarse barrier
        assert not published and notes(result, LazyBuild)
    else:
        assert published and published[0].stream == "forward"
        snapshot, forward = notes(result, Snapshot)[0], notes(result, Forward)[0]
        assert snapshot.sparse == forward.sparse == (name != "extend-dense")


def test_eagle_resolves_pre_replay_but_never_publishes(target, harness_device):
    case = Case(dims=DIMS, spec=SpeculativeAlgorithm.EAGLE,
                batches=(Batch(requests=(Request(10, 7),), mutations=(REWRITE,)),))
    result = run_case(target, case, harness_device, target_spec=SGLANG)
    assert result.findings == [], [f.message for f in result.findings]
    assert notes(result, Snapshot) and not notes(result, Publish)  # the gate is at publish time


EAGLE_PREFILLS = Case(dims=DIMS, spec=SpeculativeAlgorithm.EAGLE,
                     batches=(Batch(requests=(Request(10, 7), Request(3, 2)), mutations=(REWRITE,)),
                              Batch(mode=ForwardMode.MIXED, requests=(Request(130, 4),)),
                              Batch(mode=ForwardMode.DECODE, requests=(Request(20, 1),))))


class _DraftOffByOne(ModelRunner):
    """The reference model with a draft extend one off in every value: what the comparison must name."""

    def run_speculative_tail(self, fb):
        outputs = super().run_speculative_tail(fb)
        return {name: value + 1 for name, value in outputs.items()}


def test_eagles_draft_extend_after_a_prefill_runs_sglangs_draft_runner(target, harness_device):
    """After an EAGLE prefill (EXTEND, MIXED) SGLang's draft worker extends its NextN model over the same batch:
    here SGLang's own draft runner (`SglangDraftRunner`: a pool and backend built by their `__init__`s as a draft
    worker's, SGLang's eager runner) plans its own metadata and chunk cache, each read by its forward and numbered
    in the session's one numbering, and its output is the reference's draft extend, which the comparison checks
    (and names when it differs). After a decode batch the harness's tail still runs (no draft plans)."""
    from harness.sglang_target import differential_against_reference

    result = run_case(target, EAGLE_PREFILLS, harness_device, target_spec=SGLANG)
    assert result.findings == [], [f.message for f in result.findings]
    planned = [[r.kind.value for r in batch if isinstance(r, Planned)] for batch in result.overlapped.notes]
    assert planned[0] == planned[1] == ["attention metadata", "sparse prefill chunk cache"] * 2, planned
    assert planned[2] == ["attention metadata"], planned
    reads = {(r.kind, r.plan) for batch in result.overlapped.notes for r in batch if isinstance(r, PlanRead)}
    assert {(r.kind, r.plan) for batch in result.overlapped.notes for r in batch if isinstance(r, Planned)} <= reads
    assert [sorted(o) for o in result.overlapped.outputs][:2] == [sorted(result.overlapped.outputs[0])] * 2
    assert "draft_extend" in result.overlapped.outputs[0]
    assert differential_against_reference(EAGLE_PREFILLS, target=target, device=harness_device) == []
    off = ReferenceTarget(Classes(model_runner=_DraftOffByOne), name="reference+draft_off_by_one")
    assert differential_against_reference(EAGLE_PREFILLS, target=target, reference=off,
                                          device=harness_device) == ["draft_extend"]


def _eager_extend(case: Case) -> Case:
    batches = tuple(dataclasses.replace(b, mode=ForwardMode.EXTEND, graph=False)
                    for b in case.batches if b.requests) or (Batch(),)
    return dataclasses.replace(case, batches=batches)


@settings(max_examples=20, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(case=cases(large=False, dims=FIXED_DIMS, without=frozenset({"hisparse_sparse_prefill"})).map(_eager_extend))
def test_differential_against_reference_finds_no_difference(target, harness_device, case):
    """Clean cases agree with the reference; a HiSparse case prefills dense, as every release's sparse prefill
    under HiSparse is wrong
    (`test_sglang_releases.py::test_hisparse_sparse_prefill_reads_the_c4_cache_at_logical_slots_on_every_release`)."""
    from harness.sglang_target import differential_against_reference

    assert differential_against_reference(case, target=target, device=harness_device) == []


def test_differential_names_the_fields_that_differ(target, harness_device):
    """Against a reference with one seeded difference, the check names exactly the fields it changes.

    (It first found a real one: 0.5.23's eager runner runs a MIXED batch as EXTEND and publishes,
    where the reference did not; the reference now follows the real code.)"""
    from harness.mutants.corpus import mutant_target
    from harness.sglang_target import differential_against_reference

    mixed = Case(dims=DIMS, batches=(Batch(mode=ForwardMode.MIXED, requests=(Request(2, 5), Request(9, 1))),))
    assert differential_against_reference(mixed, target=target, device=harness_device) == []
    plain = Case(dims=DIMS, batches=(Batch(requests=(Request(2, 5), Request(9, 1))),))
    assert differential_against_reference(plain, target=target, reference=mutant_target("fast_path_lost"),
                                          device=harness_device) == ["publish"]


SPARSE_WITH_REWRITE = Case(dims=DIMS, batches=(Batch(requests=(Request(6, 5), Request(0, 4)),
                                          mutations=(Mutation("req_to_token_rewrite", count=2),)),))


def test_seeded_break_snapshot_skips_the_build_is_reported(target, harness_device, monkeypatch):
    """The installed package broken: the snapshot claims PRE_REPLAY without building the cache."""
    from harness.sglang_target.api import load_api

    api = load_api()
    monkeypatch.setattr(api.backend_cls, "_snapshot_prefill_shared_reads",
                        lambda self, fb, *, num_qo_tokens: api.mods["base_backend"].SharedReadEnds.PRE_REPLAY)
    result = run_case(target, SPARSE_WITH_REWRITE, harness_device, target_spec=SGLANG)
    found = set(kinds(result))
    assert ("policy", "read-after-publish") in found and ("policy", "sparse-decision-disagrees") in found
    assert ("happens-before", "unordered-access") in found
    assert "--target sglang" in result.replay and "--case" in result.replay


def test_seeded_break_backend_without_token_to_kv_pool_is_reported(target, harness_device, monkeypatch):
    """The #36639 fixture bug: an object-built backend that never got `token_to_kv_pool`."""
    from harness.sglang_target.model_runner import SglangModelRunner

    build = SglangModelRunner._build_backend

    def broken(self):
        backend = build(self)
        del backend.token_to_kv_pool
        return backend

    monkeypatch.setattr(SglangModelRunner, "_build_backend", broken)
    result = run_case(target, SPARSE_WITH_REWRITE, harness_device, target_spec=SGLANG)
    assert ("execution", "target-raised") in kinds(result)
    assert "token_to_kv_pool" in result.findings[0].message and "--target sglang" in result.replay


@pytest.mark.parametrize("name", ["extend-sparse", "extend-dense"])
def test_an_eager_extend_batch_runs_sglangs_own_backend(target, harness_device, name, monkeypatch):
    """An eager EXTEND batch goes through the backend SGLang's own `__init__` built, its metadata init and its
    per-layer forward (sparse or dense, as the case's switch says), on either device."""
    backend_cls = target.api.backend_cls
    calls = _counting(monkeypatch, backend_cls, ("__init__", "init_forward_metadata", "forward",
                                                 "_forward_prefill_sparse"))
    result = run_case(target, FIXED[name], harness_device, target_spec=SGLANG)
    assert result.findings == [], [f.message for f in result.findings]
    layers, runs = len(DIMS.layer_ratios), 3  # overlapped, barriered, and the reference oracle's run
    assert calls["__init__"] == runs
    assert calls["init_forward_metadata"] == runs
    assert calls["forward"] == runs * layers
    assert calls["_forward_prefill_sparse"] == (runs * layers if name == "extend-sparse" else 0)


DECODE_AFTER_EXTEND = Case(dims=DIMS, batches=(
    Batch(requests=(Request(9, 6), Request(2, 3))),
    Batch(mode=ForwardMode.DECODE, requests=(Request(15, 1), Request(5, 1)), mutations=(Mutation("req_to_token_rewrite"),))))


def test_a_decode_plan_one_token_short_is_found(target, harness_device, monkeypatch):
    """SGLang's decode metadata planned for one token fewer than the batch holds (each request's own new token left
    out of its attention): the real decode forward reads the shorter plan, and the float64 oracle sees it."""
    backend_cls = target.api.backend_cls
    planned = backend_cls.init_forward_metadata_decode

    def short(self, max_seq_len, req_pool_indices, seq_lens, out_cache_loc):
        return planned(self, max_seq_len, req_pool_indices, seq_lens - 1, out_cache_loc)

    monkeypatch.setattr(backend_cls, "init_forward_metadata_decode", short)
    result = run_case(target, DECODE_AFTER_EXTEND, harness_device, target_spec=SGLANG)
    assert "float64" in {f.oracle for f in result.findings}, [f.message for f in result.findings]


VERIFY_AFTER_EXTEND = Case(dims=DIMS, spec=SpeculativeAlgorithm.DSPARK, batches=(
    Batch(requests=(Request(3, 5), Request(0, 4))),
    Batch(mode=ForwardMode.TARGET_VERIFY, requests=(Request(290, 3), Request(4, 2)),
          mutations=(Mutation("req_to_token_rewrite"),))))


@pytest.mark.parametrize("case,plans", [
    (DECODE_AFTER_EXTEND, ("init_forward_metadata_decode", "make_forward_metadata_from_raw_decode")),
    (VERIFY_AFTER_EXTEND, ("init_forward_metadata_target_verify", "make_forward_metadata_from_raw_verify")),
], ids=["decode", "verify"])
def test_an_eager_decode_or_verify_batch_runs_sglangs_own_init_and_forward(target, harness_device, monkeypatch, case,
                                                                           plans):
    """A DECODE or TARGET_VERIFY batch (eager: the decode-graph runner is not this path's) goes through the backend's
    own metadata init, whose raw metadata is made whole (`init_forward_metadata_in_graph`), and its per-layer
    forward. The decode batch's first request's token completes a c4 block (16 tokens), which the compressor stores
    by SGLang's decode plan; the verify batch has unequal verify lengths (SGLang's ragged verify), and the backend
    was built by a server whose draft width is the widest verify request (its verify buffers)."""
    calls = _counting(monkeypatch, target.api.backend_cls, (*plans, "forward"))
    result = run_case(target, case, harness_device, target_spec=SGLANG)
    assert result.findings == [], [f.message for f in result.findings]
    layers, runs = len(DIMS.layer_ratios), 3
    assert calls[plans[0]] == calls[plans[1]] == runs
    assert calls["forward"] == 2 * runs * layers  # the EXTEND batch's layers and the second batch's


def test_a_verify_plan_without_the_verify_tokens_is_found(target, harness_device, monkeypatch):
    """SGLang's raw verify metadata handed on with no verify lengths (each verify token planned as if the draft
    tokens before it were not there): the real forward reads the shorter plan, and the float64 oracle sees it."""
    backend_cls = target.api.backend_cls
    made_whole = backend_cls.make_forward_metadata_from_raw_verify

    def short(self, raw_metadata, *args, **kwargs):
        raw_metadata.seq_lens = raw_metadata.seq_lens - raw_metadata.extend_seq_lens
        return made_whole(self, raw_metadata, *args, **kwargs)

    monkeypatch.setattr(backend_cls, "make_forward_metadata_from_raw_verify", short)
    result = run_case(target, VERIFY_AFTER_EXTEND, harness_device, target_spec=SGLANG)
    assert "float64" in {f.oracle for f in result.findings}, [f.message for f in result.findings]


def test_a_read_the_real_forward_was_not_meant_to_make_is_an_undeclared_access(target, harness_device, monkeypatch):
    """SGLang's forward broken in its own code: every layer's store translates its write locations through the live
    Full-to-SWA mapping. No declaration names that read; the observer sees it, names SGLang's line, and the tracker
    judges it against the scheduler's rewrite of the mapping after the event."""
    if harness_device != "cpu":
        pytest.skip("the real forward runs on the CPU simulator only (phase 1)")
    backend_cls = target.api.backend_cls

    def live(self, forward_batch):
        return self.token_to_kv_pool.translate_loc_from_full_to_swa(forward_batch.out_cache_loc).to(torch.int32)

    monkeypatch.setattr(backend_cls, "get_swa_out_cache_loc", live)
    case = Case(dims=DIMS, batches=(Batch(requests=(Request(6, 5), Request(0, 4)),
                                          mutations=(Mutation("swa_clear", count=4),)),))
    result = run_case(target, case, harness_device, target_spec=SGLANG, oracles=frozenset({"happens-before"}))
    undeclared = [f for f in result.findings if f.kind == "undeclared-access"]
    assert undeclared and "'full_to_swa'" in undeclared[0].message, [f.message for f in result.findings]
    assert "DeepseekV4AttnBackend.forward" in undeclared[0].message


def test_a_case_at_other_sizes_is_refused(target, harness_device):
    """0.5.23's backend asserts DSV4's page size, head_dim and top-k: a case at other sizes is refused, naming them."""
    if not FIXED_DIMS:
        pytest.skip("this release's backend takes any sizes")
    small = Case(batches=(Batch(requests=(Request(3, 5),)),))
    with pytest.raises(InvalidArgument, match="page_size=256"):
        target.open(small, make_device(harness_device))


def test_retiled_interpreter_launch_matches_sglangs_launch(target, monkeypatch):
    """Large batches launch the real combine kernel (and the V4 dequantizer) with a wider tile; the outputs must
    not change."""
    from harness.sglang_target.api import RetiledKernel

    if target.api.kernels_on != "cpu":
        pytest.skip("the retiled launch is the interpreter's; compiled kernels keep SGLang's launch")

    combine = target.api.mods["kernels"].combine_topk_swa_indices
    lens, pad = [13, 1, 22], 5
    starts = torch.tensor([0, 13, 14, 36], dtype=torch.int32)
    seq = torch.tensor([20, 9, 40], dtype=torch.int32)
    pos = torch.cat([torch.arange(s - n, s) for s, n in zip(seq.tolist(), lens)] + [torch.zeros(pad, dtype=torch.int64)])
    topk = torch.randint(-1, 9, (sum(lens) + pad, 4), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    args = dict(topk_indices=topk, query_start_loc=starts, query_pos=pos.to(torch.int32), seq_lens=seq,
                gather_lens=torch.minimum(seq, torch.tensor(lens, dtype=torch.int32) + 7),
                compressed_base=torch.tensor([0, 10, 20], dtype=torch.int32),
                swa_base=torch.tensor([30, 50, 60], dtype=torch.int32), window_size=8, compress_ratio=4, topk=4)
    assert isinstance(target.api.mods["kernels"]._combine_topk_swa_indices_kernel, RetiledKernel)
    monkeypatch.setattr(RetiledKernel, "ABOVE", 8)
    retiled = combine(**args)
    monkeypatch.setattr(RetiledKernel, "ABOVE", 1 << 30)
    original = combine(**args)
    assert torch.equal(retiled[0], original[0]) and torch.equal(retiled[1], original[1])
    # the V4 cache's dequantizer, which the real forward runs over the SWA and compressed caches
    from harness.sglang_target.api import DEQUANT
    from harness.sglang_target.jit_kernels import fused_store_flashmla_v4, v4_page_bytes

    dequant = importlib.import_module(DEQUANT)
    assert isinstance(dequant._dequantize_k_cache_paged_kernel, RetiledKernel)
    cache = torch.zeros(2, v4_page_bytes(16), dtype=torch.uint8)
    values = torch.randn(30, 512, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    fused_store_flashmla_v4(values, cache, torch.arange(30), 16)
    tokens = torch.randperm(32, generator=torch.Generator().manual_seed(2))[:21]
    monkeypatch.setattr(RetiledKernel, "ABOVE", 8)
    retiled = dequant.dequantize_k_cache_paged_dsv4(cache, tokens, page_size=16)
    monkeypatch.setattr(RetiledKernel, "ABOVE", 1 << 30)
    assert torch.equal(retiled.view(torch.int16),
                       dequant.dequantize_k_cache_paged_dsv4(cache, tokens, page_size=16).view(torch.int16))


def test_a_case_of_other_semantics_is_refused(target, harness_device):
    with pytest.raises(InvalidArgument, match="semantics"):
        target.open(Case(dims=DIMS, semantics="pr", spec=SpeculativeAlgorithm.DFLASH), make_device(harness_device))


def test_a_missing_sglang_name_is_an_environment_error(target, monkeypatch):
    from harness.sglang_target import api as sglang_api

    api = sglang_api.load_api()
    monkeypatch.delattr(api.mods["spec"].SpeculativeAlgorithm, "supports_prefill_shared_read_done")
    sglang_api.load_api.cache_clear()
    try:
        with pytest.raises(EnvironmentBroken, match="supports_prefill_shared_read_done") as info:
            sglang_api.load_api()
        assert info.value.exit_code == 3
    finally:
        sglang_api.load_api.cache_clear()


def test_an_import_failure_names_sglangs_failing_line(target, monkeypatch):
    """A module of the chain that fails to import (here: raises, as a missing CUDA kernel package or a torch
    API change would) is an environment error naming the module, the error and sglang's failing line."""
    import importlib

    from harness.sglang_target import api as sglang_api

    real_import = importlib.import_module

    def planted():
        raise RuntimeError("planted")

    planted.__code__ = planted.__code__.replace(co_filename="/x/sglang/srt/planted.py", co_firstlineno=1)

    def failing(name, *args):
        if name == sglang_api.BACKEND:
            planted()  # raises from "sglang/srt/planted.py", line 2
        return real_import(name, *args)

    monkeypatch.setattr(importlib, "import_module", failing)
    sglang_api.load_api.cache_clear()
    try:
        with pytest.raises(EnvironmentBroken) as info:
            sglang_api.load_api()
    finally:
        sglang_api.load_api.cache_clear()
    assert info.value.exit_code == 3
    assert (f"cannot import {sglang_api.BACKEND} (RuntimeError: planted, at sglang/srt/planted.py:2)"
            in str(info.value)), str(info.value)


def test_interface_contract_on_the_real_backend_names_the_reading_line(target, harness_device):
    """The real DeepseekV4AttnBackend as the target builds it meets the contract; without
    `token_to_kv_pool` (the CI break after #35947) the report names the attribute and sglang's line."""
    from harness.contracts.objects import check_object

    session = target.open(Case(dims=DIMS, batches=(Batch(requests=(Request(3, 5),)),)), make_device(harness_device))
    backend = session.model_runner.attn_backend
    entry = ("resolve_prefill_shared_read_ends", "shared_read_ends")
    assert [b.attribute for b in check_object(backend, entry)] == []
    del backend.token_to_kv_pool
    breaks = check_object(backend, entry)
    assert [b.attribute for b in breaks] == ["token_to_kv_pool"]
    assert "sglang/srt/layers/attention/deepseek_v4_backend.py:" in str(breaks[0])


def test_a_reused_buckets_refresh_that_keeps_the_chunk_cache_is_found(target, harness_device, monkeypatch):
    """A breakable replay reuses its bucket's captured metadata: SGLang's refresh must drop the chunk cache an earlier
    replay's sparse forward built into it (`DSV4Metadata.refresh_for_breakable_cuda_graph_replay_`). The target notes
    what the refreshed metadata kept (`MetadataReuse`): clean, nothing; a refresh that keeps the cache is a `policy`
    finding on the second replay."""
    replay = Batch(requests=(Request(2, 5),), graph=True, mutations=(REWRITE,))
    case = Case(dims=DIMS, graph_contract="bcg", batches=(replay, replay))  # sparse prefill on: each replay builds one
    result = run_case(target, case, harness_device, target_spec=SGLANG)
    assert result.findings == [], [f.message for f in result.findings]
    assert notes(result, MetadataReuse)

    metadata_cls = target.api.mods["backend"].DSV4Metadata
    refresh = metadata_cls.refresh_for_breakable_cuda_graph_replay_

    def keeps_cache(self, static_metadata):
        kept = self.sparse_prefill_cache
        refresh(self, static_metadata)
        self.sparse_prefill_cache = kept
    monkeypatch.setattr(metadata_cls, "refresh_for_breakable_cuda_graph_replay_", keeps_cache)
    found = run_case(target, case, harness_device, target_spec=SGLANG).findings
    assert any(f.oracle == "policy" and "kept the sparse cache" in f.message for f in found), \
        [f.message for f in found]


def test_sglangs_own_runner_scheduler_and_metadata_methods_run(target, harness_device, monkeypatch):
    """The target calls SGLang's own entry points (no copy of them in the session): each is wrapped with a
    counting pass-through and must have run, in the order SGLang's overlap loop runs them."""
    api = target.api
    mods = api.mods
    entries = [(mods["eager_runner"].EagerRunner, "execute"), (mods["eager_runner"].EagerRunner, "load_batch"),
               (mods["scheduler"].Scheduler, "run_event_loop"), (mods["scheduler"].Scheduler, "event_loop_overlap"),
               (mods["scheduler"].Scheduler, "_apply_war_barrier"),
               (mods["backend"].DSV4Metadata, "refresh_for_breakable_cuda_graph_replay_"),
               (mods["backend"].DSV4AttnMetadata, "refresh_for_breakable_cuda_graph_replay_"),
               (mods["graph_runner"].PrefillCudaGraphRunner, "_prepare_forward_metadata_for_replay"),
               (mods["graph_runner"].PrefillCudaGraphRunner, "can_run_graph"),
               (mods["graph_runner"].PrefillCudaGraphRunner, "execute"),
               (mods["graph_runner"].PrefillCudaGraphRunner, "load_batch"),
               (mods["graph_runner"].PrefillCudaGraphRunner, "_execute_body_capture"),
               (mods["graph_runner"].PrefillCudaGraphRunner, "_trim_logits_output"),
               (mods["buffer_registry"].CudaGraphBufferRegistry, "fill_from"),
               (mods["publisher"], "maybe_publish_prefill_shared_read_done")]
    calls = []

    def counting(owner, name):
        real = getattr(owner, name)

        def wrapper(*args, **kwargs):
            calls.append(name if not isinstance(owner, type) else f"{owner.__name__}.{name}")
            return real(*args, **kwargs)
        monkeypatch.setattr(owner, name, wrapper)

    for owner, name in entries:
        counting(owner, name)
    for runner_module in (mods["eager_runner"], mods["graph_runner"]):  # each imported the publisher by name
        monkeypatch.setattr(runner_module, "maybe_publish_prefill_shared_read_done",
                            mods["publisher"].maybe_publish_prefill_shared_read_done)
    replay = Batch(requests=(Request(2, 5),), graph=True, mutations=(REWRITE,))
    eager = Batch(requests=(Request(3, 5),), mutations=(REWRITE,))
    case = Case(dims=DIMS, graph_contract="bcg", batches=(eager, replay, replay))  # 0.5.23's one prefill graph
    result = run_case(target, case, harness_device, target_spec=SGLANG)
    assert result.findings == [], [f.message for f in result.findings]
    assert set(calls) == {f"{o.__name__}.{n}" if isinstance(o, type) else n for o, n in entries}, calls
    loop = [c for c in calls if c.startswith("Scheduler.")]
    assert loop[:3] == ["Scheduler.run_event_loop", "Scheduler.event_loop_overlap", "Scheduler._apply_war_barrier"]
    runners = [c for c in calls if c != "CudaGraphBufferRegistry.fill_from"]  # inside each load_batch
    first_eager = runners.index("EagerRunner.execute")
    assert runners[first_eager + 1: first_eager + 3] == ["EagerRunner.load_batch", "maybe_publish_prefill_shared_read_done"]
    first_replay = runners.index("PrefillCudaGraphRunner.execute")
    replay = [c for c in runners[first_replay:] if c.startswith(("PrefillCudaGraphRunner", "maybe_publish"))]
    assert replay[:6] == [
        "PrefillCudaGraphRunner.execute", "PrefillCudaGraphRunner.load_batch",
        "PrefillCudaGraphRunner._prepare_forward_metadata_for_replay", "maybe_publish_prefill_shared_read_done",
        "PrefillCudaGraphRunner._execute_body_capture", "PrefillCudaGraphRunner._trim_logits_output"]


def test_a_breakable_graph_replay_is_sglangs_capture_refresh_and_forward(target, harness_device, monkeypatch):
    """Where the backend runs for real, a replay of the breakable graph (`bcg`) is SGLang's: the runner built by its
    own `__init__`, which captures the bucket at start-up through `capture_one_shape` (its metadata planned by the
    backend's capture init), each replay's metadata refreshed by the backend's own prep, every layer through the
    backend's `forward`; the harness fills no metadata field (`_fresh_metadata` never runs)."""
    from harness.sglang_target.model_runner import SglangModelRunner

    mods, backend_cls = target.api.mods, target.api.backend_cls
    calls = []
    entries = [(mods["graph_runner"].PrefillCudaGraphRunner, "__init__"),
               (mods["graph_runner"].PrefillCudaGraphRunner, "capture_one_shape"),
               (backend_cls, "init_forward_metadata_for_breakable_cuda_graph_capture"),
               (backend_cls, "prepare_forward_metadata_for_breakable_cuda_graph_replay"),
               (backend_cls, "forward"), (SglangModelRunner, "_fresh_metadata")]
    for owner, name in entries:
        real = getattr(owner, name)
        monkeypatch.setattr(owner, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    replay = Batch(requests=(Request(2, 5),), graph=True, mutations=(REWRITE,))
    case = Case(dims=DIMS, graph_contract="bcg", batches=(replay, replay))
    result = run_case(target, case, harness_device, target_spec=SGLANG)
    assert result.findings == [], [f.message for f in result.findings]
    layers = len(DIMS.layer_ratios)
    # the overlapped and the barriered run each open a session: each captures the bucket once, replays it twice
    assert calls.count("capture_one_shape") == calls.count("init_forward_metadata_for_breakable_cuda_graph_capture")
    assert calls.count("prepare_forward_metadata_for_breakable_cuda_graph_replay") == 2 * calls.count("capture_one_shape")
    assert calls.count("forward") == layers * calls.count("prepare_forward_metadata_for_breakable_cuda_graph_replay")
    assert calls.count("capture_one_shape") >= 1 and "_fresh_metadata" not in calls
    # each session's runner is SGLang's, and its one bucket is captured before the first replay asks for it
    assert calls.count("__init__") == calls.count("capture_one_shape") >= 2
    assert calls.index("capture_one_shape") < calls.index("prepare_forward_metadata_for_breakable_cuda_graph_replay")


def test_a_breakable_replays_attention_is_dsv4s_graph_op_over_the_live_rows(target, harness_device, monkeypatch):
    """Inside the breakable graph DSV4's model calls its attention op (`bcg_deepseek_v4_attention_with_output`, the
    eager segment between captured ones), not the backend: the op gets the bucket's rows and slices them to the
    batch's live token count (`global_num_token_non_padded_cpu`, which the static batch carries from the live one)
    before the backend's `forward`. So the forward runs the live rows, and a layer whose captured SWA write
    locations cover the bucket translates the live rows' through the mapping (`get_swa_out_cache_loc`), declared."""
    from harness.sglang_target import eager

    mods, backend_cls = target.api.mods, target.api.backend_cls
    rows = {"op": [], "forward": []}
    callable_op, forward = eager.sglang_op, backend_cls.forward

    def counted_op(op, kernels_on):
        assert op is mods["model"].deepseek_v4_attention_with_output  # the model's own op, as SGLang's model has it
        run = callable_op(op, kernels_on)
        return lambda query, *args: rows["op"].append(query.shape[0]) or run(query, *args)

    def counted_forward(self, q, *args, **kwargs):
        rows["forward"].append(q.shape[0])
        return forward(self, q, *args, **kwargs)

    monkeypatch.setattr(eager, "sglang_op", counted_op)
    monkeypatch.setattr(backend_cls, "forward", counted_forward)
    replay = Batch(requests=(Request(2, 5),), graph=True, mutations=(REWRITE,))
    bucket = mods["base_graph_runner"].BaseCudaGraphRunner._pad_to_bucket(
        5, mods["buckets"].generate_prefill_cuda_graph_batch_sizes(2048))
    assert bucket > 5  # the case pads: the op has rows to slice off
    result = run_case(target, Case(dims=DIMS, graph_contract="bcg", batches=(replay,)), harness_device,
                      target_spec=SGLANG)
    assert result.findings == [], [f.message for f in result.findings]
    # every layer of every run of the case (the overlapped one, the barriered one, ...): the op over the bucket,
    # the forward it calls over the live rows
    calls = len(rows["op"])
    assert calls and calls % len(DIMS.layer_ratios) == 0
    assert rows["op"] == [bucket] * calls and rows["forward"] == [5] * calls


def test_each_session_starts_with_an_empty_process_wide_input_buffer_pool(target, harness_device):
    """SGLang coalesces graph input buffers of one name and size process-wide (`input_buffers.share_input_buffer`);
    a server has one such pool for its life, a campaign's process opens a session per case. The last case's
    `out_cache_loc` (here: slots far beyond any pool) must not reach this case's start-up capture, which translates
    it through the Full-to-SWA mapping: found on CUDA as a device-side assert in
    `init_forward_metadata_for_breakable_cuda_graph_capture`, one case in a hundred, never in a server."""
    replay = Batch(requests=(Request(2, 5),), graph=True)
    case = Case(dims=DIMS, graph_contract="bcg", batches=(replay,))
    pool = target.api.mods["input_buffers"]._forward_input_buffer_pool
    assert run_case(target, case, harness_device, target_spec=SGLANG).findings == []
    assert pool, "the first case's runner put no buffer in SGLang's process-wide pool: nothing is checked here"
    for buffer in pool.values():  # the last case's slots, out of the range of this case's pools
        buffer.fill_(1 << 30)
    result = run_case(target, case, harness_device, target_spec=SGLANG)
    assert result.findings == [], [f.message for f in result.findings]


def test_a_breakable_bucket_wider_than_the_request_table_is_captured_in_requests_that_fit(target, harness_device):
    """SGLang captures a bucket as requests of at most the model's context length, which its request table spans;
    the harness's table is as wide as the case's longest request (256 here), so the capture's requests are cut to
    it (the runner's max context). A bucket of 1024 tokens was once captured as one 1024-token request: SGLang's
    own metadata build refused it (found by a CUDA campaign)."""
    requests = tuple(Request(0, 90) for _ in range(9))  # 810 tokens, each request within one 256-token page
    case = Case(dims=dataclasses.replace(DIMS, layer_ratios=(4,)), graph_contract="bcg",
                batches=(Batch(requests=requests, graph=True, mutations=(REWRITE,)),))
    result = run_case(target, case, harness_device, target_spec=SGLANG)
    assert result.findings == [], [f.message for f in result.findings]
    assert notes(result, GraphReplay)[0].bucket > 256


def test_a_captured_segment_keeps_the_tensors_bound_at_capture():
    """`real_graph.bound_at_capture`: what a captured graph holds of the metadata. A refresh that copies into a
    captured tensor is seen; one that re-binds the field (on the object or a nested one) is not, as on a GPU."""
    from harness.sglang_target.real_graph import bound_at_capture

    core = SimpleNamespace(out_loc=torch.zeros(3), plan=SimpleNamespace(rows=torch.zeros(2)))
    metadata = SimpleNamespace(core_attn_metadata=core, cache=None)
    held = bound_at_capture(metadata)
    core.out_loc.copy_(torch.ones(3))  # refreshed in place: the captured kernel reads it
    core.plan.rows = torch.full((2,), 7.0)  # re-bound: the captured kernel still reads the old tensor
    metadata.core_attn_metadata = SimpleNamespace(out_loc=torch.full((3,), 5.0))
    assert held.core_attn_metadata.out_loc.tolist() == [1.0, 1.0, 1.0]
    assert held.core_attn_metadata.plan.rows.tolist() == [0.0, 0.0]


def test_the_command_line_runs_the_sglang_target_as_a_user_types_it(tmp_path, harness_device):
    """`python -m harness run --target sglang` in a fresh process, Triton's mode left to the harness: no
    module the command imports may import triton before the target chooses its mode (one once did, and
    every CPU run was refused)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-m", "harness", "run", "--target", "sglang", "--device", harness_device,
                           "--examples", "2", "--report-dir", str(tmp_path / "report"), "-q"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-2000:]


def _idle_step_case() -> Case:
    return Case(dims=DIMS, graph_contract="bcg", batches=(
        Batch(requests=(Request(5, 3),), mutations=(REWRITE,)),
        Batch(mode=ForwardMode.IDLE, requests=(), mutations=(Mutation("req_to_token_rewrite", target="other"),)),
        Batch(requests=(Request(2, 4),), graph=True, mutations=(REWRITE,)),
        Batch(requests=(Request(2, 4),), graph=True, mutations=(REWRITE,))))


def test_sglangs_plans_are_numbered_and_each_forward_reads_its_own(target, harness_device):
    """The `freshness` oracle on the real target: SGLang's metadata init, the breakable replay's refresh and the
    resolver's chunk-cache build are numbered plans (`plans.Plans`), each forward's read names the plan it read,
    and on clean code every read is of a plan of its own batch; the idle step (SGLang drops the metadata) reads
    nothing planned."""
    result = run_case(target, _idle_step_case(), harness_device, target_spec=SGLANG)
    assert result.findings == [], [f.message for f in result.findings]
    per_batch = [[r for r in batch if isinstance(r, (Planned, PlanRead))] for batch in result.overlapped.notes]
    for index, records in enumerate(per_batch):
        reads = [r for r in records if isinstance(r, PlanRead)]
        assert reads, f"batch {index} noted no read: {records}"
        if index == 1:
            assert [r.plan for r in reads] == [None]
        else:
            own = {r.plan for r in records if isinstance(r, Planned)}
            assert all(r.plan in own for r in reads), records


def test_an_idle_step_that_keeps_the_metadata_is_found_stale(target, harness_device, monkeypatch):
    """`EagerRunner._execute_idle` without its drop of the metadata (SGLang's comment: "unpadded must drop stale
    forward_metadata to avoid an SWA use-after-free on req_pool"), rebuilt from SGLang's own source with that one
    statement removed: the idle step's forward reads the previous batch's plan, and `freshness` says so."""
    runner_cls = target.api.mods["eager_runner"].EagerRunner
    source = textwrap.dedent(inspect.getsource(runner_cls._execute_idle))
    drop = "model_runner.attn_backend.forward_metadata = None"
    assert source.count(drop) == 1, "this sglang's _execute_idle no longer drops the metadata in one statement"
    namespace = {}
    exec(compile(source.replace(drop, "pass"), "<_execute_idle without the drop>", "exec"),
         vars(inspect.getmodule(runner_cls)), namespace)
    monkeypatch.setattr(runner_cls, "_execute_idle", namespace["_execute_idle"])
    result = run_case(target, _idle_step_case(), harness_device, target_spec=SGLANG,
                      oracles=frozenset({"freshness"}))
    stale = [f for f in result.findings if f.kind == "stale-plan"]
    assert stale and stale[0].batch == 1 and "planned for batch 0" in stale[0].message, \
        [f.message for f in result.findings]


@pytest.mark.parametrize("cp_active", [False, True])
def test_a_case_runs_on_a_server_with_cp_only_where_it_turns_cp_on(target, cp_active):
    """The server a case runs on has the harness's CP width only where the case turns CP on (SGLang refuses its
    ragged verify planning on a CP server, so a CP-less case must not run on one)."""
    case = Case(dims=DIMS, flags=Flags(cp_active=cp_active))
    with sglang_config(target.api, case):
        assert target.api.mods["runtime"].get_parallel().attn_cp_size == (CP_SIZE if cp_active else 1)
