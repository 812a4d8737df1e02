"""`--target sglang` on whichever released sglang is installed (0.5.19 to 0.5.23): the same checks for each.

The API generation is recognised from the package; its cases are of the semantics the generation implements
(`pr` for 0.5.19 to 0.5.22, whose DSV4 backend snapshots for the DFLASH family only, `0.5.23` after); each
runs through that release's own eager and graph runners, hook, publisher and scheduler loop, and its backend's
own `__init__`, metadata init and forward. CI runs this file on 0.5.23, on 0.5.22 and on the oldest PR-era release,
0.5.19 (`.ci/run`); skipped without sglang.
"""

from __future__ import annotations

from harness.sglang_target.api import prepare_triton

prepare_triton()

import pytest  # noqa: E402

pytest.importorskip("sglang", reason="the sglang package is not installed: --target sglang needs one release "
                                     "(harness/sglang_target/__init__.py says how)")

import dataclasses  # noqa: E402
from importlib.metadata import version as dist_version  # noqa: E402
from types import SimpleNamespace  # noqa: E402

from hypothesis import HealthCheck, given, settings  # noqa: E402

from harness.campaign import run_campaign  # noqa: E402
from harness.case import CP_SIZE, Batch, Case, Dims, Flags, Mutation, Request  # noqa: E402
from harness.device import make_device  # noqa: E402
from harness.engine import run_case  # noqa: E402
from harness.errors import InvalidArgument  # noqa: E402
from harness.model.enums import ForwardMode, SpeculativeAlgorithm  # noqa: E402
from harness.model.runners import generate_speculative_cuda_graph_batch_sizes  # noqa: E402
from harness.sglang_target.api import load_api  # noqa: E402
from harness.sglang_target.generations import RELEASED  # noqa: E402
from harness.sglang_target.model_runner import SglangModelRunner  # noqa: E402
from harness.sglang_target.real_backend import fixed_dims  # noqa: E402
from harness.sglang_target.real_graph import RealGraphs  # noqa: E402
from harness.sglang_target.server import DSV4_ARCHITECTURES  # noqa: E402
from harness.strategies import cases  # noqa: E402
from harness.targets import TargetSpec  # noqa: E402
from harness.targets.protocol import DraftGraphReplay, GraphReplay, Publish  # noqa: E402

INSTALLED = dist_version("sglang")
SGLANG = TargetSpec("sglang")
# Host and storage offload and HiSparse have no gate before 0.5.23: a PR-era release publishes under them, which
# the policy oracle reports (BENCHMARKS.md, "Races found in released SGLang"); the clean checks leave them off.
LATER_GATES = frozenset({"hierarchical_cache", "hicache_storage", "lmcache", "hisparse"})
REWRITE = Mutation("req_to_token_rewrite", count=2)
# The sizes the release's cases run at: those its backend asserts (DSV4's; 0.5.19 and 0.5.20 its SWA window too).
FIXED_DIMS = tuple(fixed_dims(load_api()).items())
DIMS = Dims(**dict(FIXED_DIMS))


@pytest.fixture(scope="module")
def target():
    from harness.sglang_target import SglangTarget

    return SglangTarget()


def _case(target, *batches, contract="bcg", **flags) -> Case:
    """A case of the installed release's semantics, with a spec that publishes in it."""
    spec = SpeculativeAlgorithm.DFLASH if target.semantics == "pr" else SpeculativeAlgorithm.NONE
    return Case(semantics=target.semantics, spec=spec, graph_contract=contract, batches=batches, dims=DIMS,
                flags=Flags(SGLANG_ENABLE_PREFILL_WAR_READ_DONE=True, **flags))


def _published(result) -> list[Publish]:
    return [r for batch in result.overlapped.notes for r in batch if isinstance(r, Publish)]


def test_the_release_is_recognised_and_named(target):
    generation = RELEASED[INSTALLED]
    semantics = generation.semantics
    assert target.version == INSTALLED and target.semantics == semantics and target.api.generation is generation
    assert f"sglang {INSTALLED}, adapter {generation.name}" in target.description
    assert target.cannot_run == (frozenset() if semantics == "0.5.23" else frozenset({"cp_active"}))
    # no release replays DSV4's prefill graph under tc_piecewise (the `fresh` contract): 0.5.22 removed the backend,
    # and to 0.5.21, where it is offered, SGLang's own server resolution turns it off for DSV4's architecture
    assert target.graph_contracts == ("bcg",)
    # the sizes its backend asserts: DSV4's page, head_dim and top-k; 0.5.19's and 0.5.20's SWA window too
    assert target.fixed_dims == {"page_size": 256, "head_dim": 512, "index_topk": 512, "kv_format": "fp8_v4",
                                 **({"swa_window": 128} if INSTALLED in ("0.5.19", "0.5.20") else {})}


def test_no_release_replays_dsv4s_prefill_graph_under_tc_piecewise(target):
    """The `fresh` contract is a tc_piecewise replay. The releases that offer that prefill backend (to 0.5.21) list
    DSV4's architecture in `piecewise_cuda_graph_disabled_model_archs`, so a DSV4 server asking for it gets no
    prefill graph ("model-arch blacklist" in `disable_tc_piecewise_cudagraph_if_incompatible`); the target asks
    SGLang's own predicate and replays under `bcg` only. A release that dropped DSV4 from that list would bring
    `fresh` back."""
    mods = target.api.mods
    config = mods["graph_config"]
    offered = getattr(config.Backend, "TC_PIECEWISE", None) in config.ALLOWED_BACKENDS_PER_PHASE[config.Phase.PREFILL]
    assert offered == (INSTALLED in ("0.5.19", "0.5.20", "0.5.21"))
    assert mods["model_config"].is_piecewise_cuda_graph_disabled_model(DSV4_ARCHITECTURES)
    assert target.graph_contracts == ("bcg",)


@pytest.mark.parametrize("shape", ["eager-sparse", "eager-dense", "graph-bcg"])
def test_each_path_runs_clean_through_the_releases_runners(target, harness_device, shape):
    batch = Batch(requests=(Request(6, 5), Request(0, 4)), graph=shape.startswith("graph"), mutations=(REWRITE,))
    case = _case(target, batch, SGLANG_OPT_FLASHMLA_SPARSE_PREFILL=shape != "eager-dense")
    result = run_case(target, case, harness_device, target_spec=SGLANG)
    assert result.findings == [], [f.message for f in result.findings]
    published = _published(result)
    if shape == "graph-bcg":  # the captured-metadata replay builds no snapshot: the coarse barrier
        assert not published
    else:
        assert published and published[0].stream == "forward"


def _counting(monkeypatch, owner, names) -> dict:
    """Each of `owner`'s methods `names` called through, counted."""
    calls = dict.fromkeys(names, 0)
    for name in names:
        def counted(*args, _real=getattr(owner, name), _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)
        monkeypatch.setattr(owner, name, counted)
    return calls


@pytest.mark.parametrize("mode", [ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND])
def test_every_eager_batch_runs_the_releases_own_init_and_forward(target, harness_device, monkeypatch, mode):
    """On every release an eager EXTEND batch and the DECODE, TARGET_VERIFY or DRAFT_EXTEND batch after it go through
    the backend its own `__init__` built, its `init_forward_metadata` and its per-layer `forward`, not the harness's
    metadata and layers. A draft-extend batch's target part is the verify of its tokens (SGLang's target never runs a
    draft-extend batch): the backend's verify plan."""
    second = (Request(15, 1), Request(5, 1)) if mode is ForwardMode.DECODE else (Request(290, 3), Request(4, 2))
    case = _case(target, Batch(requests=(Request(9, 6), Request(2, 3))),
                 Batch(mode=mode, requests=second, mutations=(REWRITE,)))
    calls = _counting(monkeypatch, target.api.backend_cls, ("__init__", "init_forward_metadata", "forward",
                                                            "init_forward_metadata_target_verify"))
    harness_fills = _counting(monkeypatch, SglangModelRunner, ("_fresh_metadata",))
    result = run_case(target, case, harness_device, target_spec=SGLANG)
    assert result.findings == [], [f.message for f in result.findings]
    runs = 3  # overlapped, barriered, the reference oracle's run
    verifies = runs if mode is not ForwardMode.DECODE else 0
    assert calls == {"__init__": runs, "init_forward_metadata": 2 * runs,
                     "forward": 2 * runs * len(DIMS.layer_ratios),
                     "init_forward_metadata_target_verify": verifies}, calls
    assert harness_fills == {"_fresh_metadata": 0}


def test_eagles_draft_extend_after_a_prefill_runs_the_releases_own_draft_runner(target, harness_device, monkeypatch):
    """On every release, after an EAGLE prefill (EXTEND, then MIXED) the draft extend goes through a second backend,
    built by its own `__init__` as a draft worker's (one SWA-only NextN layer), planned by its `init_forward_metadata`
    and run by its `forward`, and matches the reference model's draft extend (the `reference` oracle compares it)."""
    case = dataclasses.replace(_case(target, Batch(requests=(Request(9, 6), Request(2, 3)), mutations=(REWRITE,)),
                                     Batch(mode=ForwardMode.MIXED, requests=(Request(140, 2),))),
                               spec=SpeculativeAlgorithm.EAGLE)
    calls = _counting(monkeypatch, target.api.backend_cls, ("__init__", "init_forward_metadata", "forward"))
    result = run_case(target, case, harness_device, target_spec=SGLANG)
    assert result.findings == [], [f.message for f in result.findings]
    runs, batches = 3, 2  # overlapped, barriered, the reference oracle's run
    assert calls == {"__init__": 2 * runs, "init_forward_metadata": 2 * batches * runs,
                     "forward": batches * runs * (len(DIMS.layer_ratios) + 1)}, calls
    assert all("draft_extend" in outputs for outputs in result.overlapped.outputs)


# The releases whose draft-extend graph runner records and publishes read-done before its replay, while the replay's
# recorded in-graph metadata step (`init_forward_metadata_in_graph`) translates the write locations through the live
# Full-to-SWA mapping: a race of released SGLang. 0.5.22 publishes from the backend's declaration (UNKNOWN for a draft
# extend: the coarse barrier), "an event before replay cannot cover metadata reads inside the graph".
PUBLISHES_BEFORE_DRAFT_REPLAY = ("0.5.19", "0.5.20", "0.5.21")


def _eagle_draft_extend(target, draft: Batch) -> Case:
    """An EAGLE case: a prefill of one request, then `draft`, under the release's graph contract."""
    return dataclasses.replace(_case(target, Batch(requests=(Request(10, 3),)), draft,
                                     contract=target.graph_contracts[-1]), spec=SpeculativeAlgorithm.EAGLE)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_eagles_draft_extend_after_a_verify_runs_the_releases_own_runners(target, harness_device, monkeypatch, graph):
    """A draft-extend batch (every request the server's draft width, as `prepare_for_draft_extend` makes it) runs the
    release's own draft path: eagerly the draft backend's draft-extend plan and `forward`; replayed, SGLang's
    draft-extend graph runner: `capture_one_shape` at start-up, `execute` (the plan outside the graph, the publish)
    and the captured in-graph metadata step and `forward`. Its output is the reference's draft extend. Replayed while
    the scheduler clears the batch's mapping entries: on 0.5.19 to 0.5.21 the runner publishes before the replay,
    whose in-graph step reads the mapping after the event, a race the tracker reports with both sides; later releases
    fall back to the coarse barrier and nothing is found."""
    draft = Batch(mode=ForwardMode.DRAFT_EXTEND, requests=(Request(13, 3), Request(20, 3)), graph=graph,
                  mutations=(Mutation("swa_clear", count=3),))
    case = _eagle_draft_extend(target, draft)
    runner_cls = target.api.mods["draft_graph_runner"].EAGLEDraftExtendCudaGraphRunner
    graph_calls = _counting(monkeypatch, runner_cls, ("capture_one_shape", "execute"))
    plans = _counting(monkeypatch, target.api.backend_cls, ("init_forward_metadata_draft_extend",))
    result = run_case(target, case, harness_device, target_spec=SGLANG)
    runs = 3  # overlapped, barriered, the reference oracle's run
    assert all("draft_extend" in outputs for outputs in result.overlapped.outputs)
    if not graph:
        assert result.findings == [], [f.message for f in result.findings]
        assert graph_calls == {"capture_one_shape": 0, "execute": 0}
        assert plans == {"init_forward_metadata_draft_extend": runs}, plans
        return
    # per run one batch size captured (2 requests) and one replay, planned by the draft-extend plan (the capture's
    # too, where the release plans it at capture)
    if INSTALLED not in PUBLISHES_BEFORE_DRAFT_REPLAY:
        assert result.findings == [], [f.message for f in result.findings]
        assert graph_calls == {"capture_one_shape": runs, "execute": runs}, graph_calls
    else:  # the overlapped and barriered runs (the reference oracle's follows where nothing else was found)
        assert graph_calls["capture_one_shape"] == graph_calls["execute"] in (2, runs), graph_calls
    assert plans["init_forward_metadata_draft_extend"] in (graph_calls["execute"], 2 * graph_calls["execute"]), plans
    if INSTALLED not in PUBLISHES_BEFORE_DRAFT_REPLAY:
        return
    races = [f.message for f in result.findings if (f.oracle, f.kind) == ("happens-before", "unordered-access")]
    assert len(races) == 1, [f.message for f in result.findings]
    assert "race on 'full_to_swa'" in races[0] and "init_forward_metadata_in_graph" in races[0], races[0]
    assert "scheduler.full_to_swa.index_fill_" in races[0], races[0]
    # where the cleared entries are read the draft's KV goes to the dummy slot: its output changes too
    assert {f.oracle for f in result.findings} <= {"happens-before", "differential"}


def test_a_server_without_the_draft_extend_graph_extends_eagerly_and_its_replay_command_says_so(target,
                                                                                                  harness_device,
                                                                                                  monkeypatch):
    """`SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH` set, SGLang's draft worker captures no draft-extend graph and the draft
    extend of a replayed batch runs eagerly: the workaround of a deployment on 0.5.19 to 0.5.21, whose draft-extend
    graph races (the test above). The same case then finds nothing on every release, and a finding's replay command
    would set the setting again (the target reads it from the environment, as the server does)."""
    monkeypatch.setenv("SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH", "1")
    draft = Batch(mode=ForwardMode.DRAFT_EXTEND, requests=(Request(13, 3), Request(20, 3)), graph=True,
                  mutations=(Mutation("swa_clear", count=3),))
    case = _eagle_draft_extend(target, draft)
    runner_cls = target.api.mods["draft_graph_runner"].EAGLEDraftExtendCudaGraphRunner
    graph_calls = _counting(monkeypatch, runner_cls, ("capture_one_shape", "execute"))
    plans = _counting(monkeypatch, target.api.backend_cls, ("init_forward_metadata_draft_extend",))
    result = run_case(target, case, harness_device, target_spec=SGLANG)
    assert result.findings == [], [f.message for f in result.findings]
    assert graph_calls == {"capture_one_shape": 0, "execute": 0}, graph_calls
    assert plans == {"init_forward_metadata_draft_extend": 3}, plans  # overlapped, barriered, the reference's run
    assert result.replay.startswith("SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH=1 python -m harness replay --target sglang")


def test_a_draft_extend_replay_padded_to_its_bucket_declares_the_padded_requests_rows(target, harness_device,
                                                                                      monkeypatch):
    """Nine requests replay in the draft-extend graph's bucket of 10 (SGLang's speculative capture list skips 9): the
    runner's `init_forward_metadata_out_graph` builds the page table over the bucket, the padded request's row of
    `req_to_token` included. That read is declared, so a clean replay has no undeclared access (it once had one,
    which a regression padding to a bigger bucket turned into a false finding)."""
    requests = tuple(Request(2 + i, 3) for i in range(9))
    draft = Batch(mode=ForwardMode.DRAFT_EXTEND, requests=requests, graph=True, mutations=(Mutation("swa_clear"),))
    case = _eagle_draft_extend(target, draft)
    runner_cls = target.api.mods["draft_graph_runner"].EAGLEDraftExtendCudaGraphRunner
    monkeypatch.setenv("SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH", "0")  # the graph on, on every release
    graph_calls = _counting(monkeypatch, runner_cls, ("execute",))
    result = run_case(target, case, harness_device, target_spec=SGLANG)
    races = INSTALLED in PUBLISHES_BEFORE_DRAFT_REPLAY  # the release's own race may be found besides
    assert not [f.message for f in result.findings if f.kind == "undeclared-access"], result.findings
    assert races or result.findings == [], [f.message for f in result.findings]
    assert graph_calls["execute"] >= 2, graph_calls
    # the padded request as `execute` pads it, checked (`freshness`: a stale one is found in the static buffers)
    replays = [r for notes in result.overlapped.notes for r in notes if isinstance(r, DraftGraphReplay)]
    assert replays == [DraftGraphReplay(bucket=10, requests=9)], replays


def test_the_coverage_tables_draft_extend_buckets_are_the_releases_speculative_capture_list(target):
    """The coverage table tells a padded draft-extend replay (`FOLLOWS_LARGER_DRAFT_REPLAY`) by the reference model's
    speculative capture list; the release's own list, as its draft-extend graph runner gets it, is the same."""
    buckets = target.api.mods["buckets"]
    for max_bs in (16, 64, 256, 512):
        server = SimpleNamespace(disable_cuda_graph_padding=False, speculative_algorithm="EAGLE")
        assert generate_speculative_cuda_graph_batch_sizes(max_bs) == buckets.generate_decode_cuda_graph_batch_sizes(
            server, max_bs), max_bs


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_eagles_draft_extend_after_a_verify_batch_runs_the_releases_own_draft_path(target, harness_device, monkeypatch,
                                                                                    graph):
    """After a verify whose requests are all the server's draft width, SGLang's worker extends its draft model over the
    verified window (`EAGLEWorkerV2._draft_extend_for_decode`): the release's draft-extend plan and the NextN layer's
    `forward` run (replayed: its draft-extend graph runner), and the result is the reference's draft extend. The even
    verify is EAGLE's own (`EagleVerifyInput`: the backend plans the uniform verify, no ragged layout). A verify
    of uneven widths is no batch of an EAGLE server: it runs as DSpark's ragged verify, and its draft extend stays the
    harness's tail. Replayed while the scheduler clears the batch's mapping entries, 0.5.19 to 0.5.21 race as after a
    draft-extend batch."""
    verify = Batch(mode=ForwardMode.TARGET_VERIFY, requests=(Request(13, 3), Request(20, 3)), graph=graph,
                   mutations=(Mutation("swa_clear", count=3),))
    uneven = Batch(mode=ForwardMode.TARGET_VERIFY, requests=(Request(16, 2), Request(23, 3)))
    case = dataclasses.replace(_case(target, Batch(requests=(Request(10, 3),)), verify, uneven,
                                     contract=target.graph_contracts[-1]), spec=SpeculativeAlgorithm.EAGLE)
    runner_cls = target.api.mods["draft_graph_runner"].EAGLEDraftExtendCudaGraphRunner
    graph_calls = _counting(monkeypatch, runner_cls, ("execute",))
    plans = _counting(monkeypatch, target.api.backend_cls, ("init_forward_metadata_draft_extend",))
    uniform = []  # per target-verify plan: whether it had no ragged layout (EAGLE's uniform verify)
    plan_verify = target.api.backend_cls.init_forward_metadata_target_verify

    def noted(backend, *args, ragged_layout=None, **kwargs):
        uniform.append(ragged_layout is None)
        return plan_verify(backend, *args, ragged_layout=ragged_layout, **kwargs)

    monkeypatch.setattr(target.api.backend_cls, "init_forward_metadata_target_verify", noted)
    result = run_case(target, case, harness_device, target_spec=SGLANG)
    assert all("draft_extend" in outputs for outputs in result.overlapped.outputs[1:])
    assert uniform[:2] == [True, False], uniform  # the even verify, then the uneven one
    if graph and INSTALLED in PUBLISHES_BEFORE_DRAFT_REPLAY:
        races = [f.message for f in result.findings if (f.oracle, f.kind) == ("happens-before", "unordered-access")]
        assert races and "init_forward_metadata_in_graph" in races[0], [f.message for f in result.findings]
        return
    assert result.findings == [], [f.message for f in result.findings]
    runs = 3  # overlapped, barriered, the reference oracle's run: the even verify alone, replayed or eager
    assert graph_calls == {"execute": runs if graph else 0}, graph_calls
    assert plans["init_forward_metadata_draft_extend"] in ((runs, 2 * runs) if graph else (runs,)), plans


@pytest.mark.parametrize("field", ["page_size", "swa_window"])
def test_a_case_off_the_sizes_the_backend_asserts_is_refused_naming_the_field(target, harness_device, field):
    """Before any work (exit 2): DSV4's page size on every release; the SWA window where the release's backend
    asserts it (0.5.19, 0.5.20); elsewhere the case's window runs."""
    case = dataclasses.replace(_case(target, Batch(requests=(Request(6, 5),))),
                               dims=dataclasses.replace(DIMS, **{field: 64}))
    if field not in target.fixed_dims:
        assert run_case(target, case, harness_device, target_spec=SGLANG).findings == []
        return
    with pytest.raises(InvalidArgument, match=f"case dims.{field}=64: the installed sglang {INSTALLED}"):
        target.open(case, make_device(harness_device))


def test_a_cp_case_is_refused_where_the_release_shards_it_across_ranks(target, harness_device):
    if "cp_active" not in target.cannot_run:
        pytest.skip(f"sglang {INSTALLED} runs a CP batch in one process (the model owns the CP layout)")
    case = _case(target, Batch(requests=(Request(6, 5),)), cp_active=True)
    with pytest.raises(InvalidArgument, match="cp_active"):
        target.open(case, make_device(harness_device))


@pytest.mark.parametrize("mode", [ForwardMode.EXTEND, ForwardMode.MIXED, ForwardMode.TARGET_VERIFY])
def test_a_cp_batch_runs_every_ranks_plan_and_forward_through_the_release(target, harness_device, monkeypatch,
                                                                          mode):
    """Where the release runs CP in one process (0.5.23): a CP batch (an odd token count, so the ranks' shares are
    padded) is planned by the backend's own `init_forward_metadata` once per CP rank, each keeping its rows
    (`apply_cp_reindex`), and each rank's rows run through its `forward` per layer; no harness metadata. The
    float64 oracle then judges every token row, so a rank's plan that reads another's rows is found: here the
    SWA page indices left global. A verify is not sharded (SGLang's CP shards an extend): it runs the backend's own
    static verify plan, every request at the server's width (SGLang refuses the ragged verify under CP)."""
    if "cp_active" in target.cannot_run:
        pytest.skip(f"sglang {INSTALLED} shards a CP batch across ranks: CP cases are refused (the test above)")
    case = _case(target, Batch(requests=(Request(9, 6), Request(2, 3))),
                 Batch(mode=mode, requests=(Request(140, 4), Request(20, 1 if mode is ForwardMode.MIXED else 4)),
                       mutations=(REWRITE,)), cp_active=True)
    metadata_cls = target.api.mods["backend"].DSV4AttnMetadata
    calls = _counting(monkeypatch, target.api.backend_cls, ("init_forward_metadata", "forward"))
    reindexed = _counting(monkeypatch, metadata_cls, ("apply_cp_reindex",))
    harness_fills = _counting(monkeypatch, SglangModelRunner, ("_fresh_metadata",))
    result = run_case(target, case, harness_device, target_spec=SGLANG)
    assert result.findings == [], [f.message for f in result.findings]
    runs = 3  # overlapped, barriered, the reference oracle's run
    sharded = 1 if mode is ForwardMode.TARGET_VERIFY else 2  # the CP batches SGLang's backend ran, once per rank
    plans = CP_SIZE * sharded + (mode is ForwardMode.TARGET_VERIFY)  # and the verify, once
    assert calls == {"init_forward_metadata": plans * runs,
                     "forward": plans * runs * len(DIMS.layer_ratios)}, calls
    assert reindexed == {"apply_cp_reindex": CP_SIZE * sharded * runs}
    assert harness_fills == {"_fresh_metadata": 0}

    monkeypatch.setattr(metadata_cls, "_CP_REINDEX_FIELDS",
                        [f for f in metadata_cls._CP_REINDEX_FIELDS if f != "swa_page_indices"])
    found = run_case(target, case, harness_device, target_spec=SGLANG).findings
    assert any(f.oracle == "float64" for f in found), [f.message for f in found]


def test_a_cp_case_whose_verify_widths_differ_is_refused_naming_the_field(target, harness_device):
    """No CP server runs a verify of unequal widths (SGLang refuses the ragged verify under CP): such a hand-written
    case is refused before any work, naming the field and what is allowed, rather than run on the harness's layers."""
    if "cp_active" in target.cannot_run:
        pytest.skip(f"sglang {INSTALLED} shards a CP batch across ranks: CP cases are refused")
    case = _case(target, Batch(requests=(Request(9, 6),)),
                 Batch(mode=ForwardMode.TARGET_VERIFY, requests=(Request(15, 2), Request(20, 3))), cp_active=True)
    with pytest.raises(InvalidArgument, match=r"extend_len .* CP case .*\[2, 3\]; allowed: one width"):
        target.open(case, make_device(harness_device))
    even = dataclasses.replace(case, batches=(case.batches[0], Batch(mode=ForwardMode.DRAFT_EXTEND,
                                                                     requests=(Request(15, 3), Request(20, 3)))))
    assert run_case(target, even, harness_device, target_spec=SGLANG).findings == []


def test_a_cp_servers_batch_of_fewer_tokens_than_ranks_runs_whole_and_publishes(target, harness_device, monkeypatch):
    """SGLang's interleave strategy shards a batch only where it has at least as many tokens as CP ranks
    (`InterleaveCPStrategy.can_apply`); a one-token extend of a CP server runs whole on every rank, as without CP:
    one plan, no reindex, and the snapshot and publish of a server without CP (its `_snapshot_prefill_shared_reads`
    asks `is_cp_active` of the batch). The reference model says the same (`Flags.cp_shards`), so the policy oracle
    expects the publish, and a release whose gate asks the server instead of the batch is found."""
    if "cp_active" in target.cannot_run:
        pytest.skip(f"sglang {INSTALLED} shards a CP batch across ranks: CP cases are refused (the test above)")
    case = _case(target, Batch(requests=(Request(9, 1),), mutations=(REWRITE,)), cp_active=True)
    assert not case.flags.cp_shards(ForwardMode.EXTEND, 1) and case.flags.cp_shards(ForwardMode.EXTEND, CP_SIZE)
    metadata_cls = target.api.mods["backend"].DSV4AttnMetadata
    calls = _counting(monkeypatch, target.api.backend_cls, ("init_forward_metadata",))
    reindexed = _counting(monkeypatch, metadata_cls, ("apply_cp_reindex",))
    result = run_case(target, case, harness_device, target_spec=SGLANG)
    assert result.findings == [], [f.message for f in result.findings]
    assert calls == {"init_forward_metadata": 3} and reindexed == {"apply_cp_reindex": 0}  # 3 runs, one plan each
    assert _published(result)

    # the gate asked of the server: the unsharded batch no longer publishes, which the policy oracle finds
    backend = target.api.backend_cls
    real = backend._snapshot_prefill_shared_reads

    def by_server(self, forward_batch, *, num_qo_tokens):
        if target.api.mods["runtime"].get_parallel().attn_cp_size > 1:
            return target.api.mods["backend"].SharedReadEnds.UNKNOWN
        return real(self, forward_batch, num_qo_tokens=num_qo_tokens)
    monkeypatch.setattr(backend, "_snapshot_prefill_shared_reads", by_server)
    found = run_case(target, case, harness_device, target_spec=SGLANG).findings
    assert any(f.oracle == "policy" for f in found), [f.oracle for f in found]


def test_a_graph_bucket_longer_than_a_request_tables_row_is_captured_within_the_row(target, harness_device):
    """The prefill graph runner's start-up capture splits each bucket into requests of at most the model's context
    (0.5.19 and 0.5.20 bound them by nothing else), and a server's request table is that context wide. Two
    200-token requests pad to a bucket longer than the case's 256-token row: with the model's own context (DSV4's
    65536) as the bound, 0.5.19's capture indexed past the row (`build_causal_swa_page_indices`, IndexError), so
    the session never opened."""
    case = _case(target, Batch(requests=(Request(0, 200), Request(0, 200)), graph=True))
    result = run_case(target, case, harness_device, target_spec=SGLANG)
    assert result.findings == [], [f.message for f in result.findings]
    replays = [r for batch in result.overlapped.notes for r in batch if isinstance(r, GraphReplay)]
    assert replays and replays[0].bucket > 256, replays


def _eager_extend(case: Case) -> Case:
    batches = tuple(Batch(requests=b.requests, mutations=b.mutations) for b in case.batches if b.requests)
    return Case(semantics=case.semantics, spec=case.spec, dims=case.dims, data_seed=case.data_seed,
                flags=case.flags, batches=batches or (Batch(),))


@settings(max_examples=8, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(data=cases(RELEASED[INSTALLED].semantics, large=False, without=LATER_GATES | {"cp_active"},
                  dims=FIXED_DIMS).map(_eager_extend))
def test_the_release_and_the_reference_model_agree_field_by_field(target, harness_device, data):
    from harness.sglang_target import differential_against_reference

    assert differential_against_reference(data, target=target, device=harness_device) == []


def test_a_short_campaign_finds_nothing_but_the_releases_own_race(target, harness_device):
    """Clean on 0.5.22 and 0.5.23; on 0.5.19 to 0.5.21 the campaign stops at the case of the draft-extend graph
    runner's publish before its replay (the EAGLE seed case): the race, and where the cleared entry is read (0.5.21)
    the draft extend's output, and nothing else."""
    result = run_campaign(target, target_spec=SGLANG, device=harness_device, semantics=target.semantics,
                          examples=12, seed=3, without=LATER_GATES)
    messages = [f.message for f in result.findings]
    if INSTALLED not in PUBLISHES_BEFORE_DRAFT_REPLAY:
        assert result.cases == 12 and messages == [], messages
        return
    races = [f.message for f in result.findings if (f.oracle, f.kind) == ("happens-before", "unordered-access")]
    assert len(races) == 1 and {f.oracle for f in result.findings} <= {"happens-before", "differential"}, messages
    assert "race on 'full_to_swa'" in races[0] and "init_forward_metadata_in_graph" in races[0], races[0]


def test_a_draft_extend_declared_over_before_its_replay_differs_from_the_model_on_every_release(
        target, harness_device, monkeypatch):
    """SGLang runs EAGLE's draft extend as `DRAFT_EXTEND_V2`, the mode its draft-extend graph runner asks the backend
    about (not the `DRAFT_EXTEND` of the same name): a backend that declares those reads over before the replay
    (source-mutant row `draft_extend_declared_pre_replay`) is named by the comparison with the model, also where the
    release's campaigns run that graph off (0.5.19 to 0.5.21), so that no publish acts on the declaration."""
    from harness.sglang_target import differential_against_reference

    api = target.api
    declared = api.backend_cls.shared_read_ends
    pre_replay = api.mods["base_backend"].SharedReadEnds.PRE_REPLAY
    case = _case(target, Batch(requests=(Request(2, 5), Request(9, 1))))
    assert differential_against_reference(case, target=target, device=harness_device) == []
    monkeypatch.setattr(api.backend_cls, "shared_read_ends",
                        lambda self, fm: pre_replay if fm.is_draft_extend_v2() else declared(self, fm))
    assert differential_against_reference(case, target=target, device=harness_device) == [
        "shared_read_ends(DRAFT_EXTEND)"]


def test_a_snapshot_that_claims_its_reads_without_building_the_cache_is_found(target, harness_device, monkeypatch):
    """The release broken in its own hook: the snapshot is declared but the chunk cache is not built, so the
    first sparse layer builds it from the live tables after the event."""
    api = target.api
    if api.generation.publishes_from_read_end:
        monkeypatch.setattr(api.backend_cls, "_snapshot_prefill_shared_reads",
                            lambda self, fb, *, num_qo_tokens: api.mods["base_backend"].SharedReadEnds.PRE_REPLAY)
    else:
        def claims(self, forward_batch, *, num_qo_tokens):
            self.forward_metadata.prefill_shared_reads_snapshotted = True

        monkeypatch.setattr(api.backend_cls, "prepare_prefill_shared_read_snapshot", claims)
    case = _case(target, Batch(requests=(Request(6, 5), Request(0, 4)), mutations=(REWRITE,)))
    result = run_case(target, case, harness_device, target_spec=SGLANG)
    found = {(f.oracle, f.kind) for f in result.findings}
    assert ("policy", "read-after-publish") in found and ("happens-before", "unordered-access") in found
    assert "--target sglang" in result.replay


def _hisparse_prefill(target, *, sparse: bool, mutations=()) -> Case:
    """A HiSparse EXTEND batch over c4 history (two requests, 300 and 200 tokens of prefix, blocks in several pages),
    of a spec no release publishes for, sparse prefill on or off."""
    batch = Batch(requests=(Request(40, 300), Request(9, 200)), mutations=mutations)
    return Case(semantics=target.semantics, spec=SpeculativeAlgorithm.NONE, graph_contract="bcg", batches=(batch,),
                dims=DIMS, flags=Flags(SGLANG_ENABLE_PREFILL_WAR_READ_DONE=True, hisparse=True,
                                       SGLANG_OPT_FLASHMLA_SPARSE_PREFILL=sparse))


def test_hisparse_sparse_prefill_reads_the_c4_cache_at_logical_slots_on_every_release(target, harness_device,
                                                                                        monkeypatch):
    """A bug of every release (BENCHMARKS.md, section 31): with HiSparse the compressor stores a c4 block at its
    device slot (`HiSparseC4DevicePool.set_key_buffer_fused` translates) and the dense attention reads the indexer's
    translated page indices, but the sparse prefill gathers the c4 cache at the logical slots of the page table
    (`SparsePrefillChunkCache.ensure_compressed`), untranslated. Where the allocation moved a request's blocks (the
    session's HiSparse allocator hands out device pages in another order), the c4 layers attend over other blocks:
    the float64 oracle finds it, at the ratio-4 layer only. The same batch with dense prefill is clean. Both run
    the release's own init and forward over its HiSparse c4 pool."""
    calls = _counting(monkeypatch, target.api.backend_cls, ("init_forward_metadata", "forward"))
    dense = run_case(target, _hisparse_prefill(target, sparse=False, mutations=(Mutation("hisparse_evict", count=3),)),
                     harness_device, target_spec=SGLANG)
    assert dense.findings == [], [f.message for f in dense.findings]
    assert calls["init_forward_metadata"] == 3 and calls["forward"] == 3 * len(DIMS.layer_ratios), calls
    sparse = run_case(target, _hisparse_prefill(target, sparse=True), harness_device, target_spec=SGLANG)
    wrong = [f.message for f in sparse.findings if (f.oracle, f.kind) == ("float64", "attention-mismatch")]
    assert wrong and all("(ratio 4)" in message for message in wrong), [f.message for f in sparse.findings]
    assert {f.oracle for f in sparse.findings} <= {"float64", "reference"}, [f.message for f in sparse.findings]


def test_a_hisparse_decode_runs_the_harness_layers(target, harness_device, monkeypatch):
    """HiSparse's decode swaps the selected pages in through the HiSparse coordinator (the indexer's decode branch),
    whose host pool the harness does not run: a HiSparse case's DECODE batch runs the harness's metadata and layers,
    its EXTEND batch SGLang's."""
    case = dataclasses.replace(_hisparse_prefill(target, sparse=False), batches=(
        Batch(requests=(Request(9, 6), Request(2, 3))), Batch(mode=ForwardMode.DECODE,
                                                              requests=(Request(15, 1), Request(5, 1)))))
    calls = _counting(monkeypatch, target.api.backend_cls, ("init_forward_metadata",))
    harness_fills = _counting(monkeypatch, SglangModelRunner, ("_fresh_metadata",))
    result = run_case(target, case, harness_device, target_spec=SGLANG)
    assert result.findings == [], [f.message for f in result.findings]
    assert calls["init_forward_metadata"] == 3 and harness_fills["_fresh_metadata"] > 0, (calls, harness_fills)


@pytest.mark.parametrize("capture_step", [True, False], ids=["as-captured", "capture-step-skipped"])
def test_a_hisparse_replay_runs_the_releases_own_capture_and_forward(target, harness_device, monkeypatch,
                                                                      capture_step):
    """A HiSparse case's prefill replays go through SGLang's own start-up capture, replay prep and forward (dense
    prefill: its sparse prefill is the bug above). The capture runs DSV4's indexer once, whose HiSparse step re-binds
    the captured metadata's c4 page indices to its translation; every replay's attention reads there
    (`RealGraphs.capture_hisparse_indexer`). Without that step the attention reads the top-k at logical slots: the
    float64 oracle reports the ratio-4 layers."""
    if not capture_step:
        monkeypatch.setattr(RealGraphs, "capture_hisparse_indexer", lambda self, held, metadata: None)
    first, again = (Batch(requests=reqs, graph=True, mutations=mutations) for reqs, mutations in (
        ((Request(9, 6), Request(2, 3)), (Mutation("hisparse_evict", target="other", count=3),)),
        ((Request(30, 5), Request(7, 4)), (REWRITE,))))
    case = dataclasses.replace(_hisparse_prefill(target, sparse=False), batches=(first, again))
    captures = _counting(monkeypatch, RealGraphs, ("captured",))
    harness_fills = _counting(monkeypatch, SglangModelRunner, ("_fresh_metadata",))
    result = run_case(target, case, harness_device, target_spec=SGLANG)
    assert captures["captured"] > 0 and harness_fills["_fresh_metadata"] == 0, (captures, harness_fills)
    if capture_step:
        assert result.findings == [], [f.message for f in result.findings]
    else:
        wrong = [f.message for f in result.findings if (f.oracle, f.kind) == ("float64", "attention-mismatch")]
        assert wrong and all("(ratio 4)" in message for message in wrong), [f.message for f in result.findings]


def test_a_later_gate_the_release_lacks_is_reported_not_hidden(target, harness_device):
    """Host offload has no publish gate before 0.5.23: a PR-era release publishes under it, and the policy
    oracle says so; 0.5.23 does not publish."""
    case = _case(target, Batch(mode=ForwardMode.EXTEND, requests=(Request(6, 5),)), hierarchical_cache=True)
    result = run_case(target, case, harness_device, target_spec=SGLANG)
    found = {(f.oracle, f.kind) for f in result.findings}
    if target.semantics == "0.5.23":
        assert not _published(result) and not found
    else:
        assert _published(result) and ("policy", "unexpected-publish") in found


def test_lmcache_stores_the_stashed_chunk_unordered_where_the_release_publishes_under_it(target, harness_device):
    """The race of 0.5.21 and 0.5.22 (BENCHMARKS.md, "Races found in released SGLang"): the next step's stash
    stores the chunk to LMCache on the schedule stream, which waited only on read-done while the forward still
    writes that chunk's KV. 0.5.23 does not publish under LMCache; 0.5.19 and 0.5.20 store only after the sync."""
    case = _case(target, Batch(requests=(Request(9, 6), Request(2, 3)), mutations=(REWRITE,)), lmcache=True)
    result = run_case(target, case, harness_device, target_spec=SGLANG)
    races = [f for f in result.findings if f.kind == "unordered-access" and "lmcache.store" in f.message]
    if target.api.generation.stores_stashed_chunk and target.semantics == "pr":
        assert races, [f.message for f in result.findings]
        # The stored chunk differs on the simulator. On the H200 (session 19, 0.5.22) the race was found but the
        # store read the chunk after the held forward had written it (its gates opened by deadline, after 23 and
        # 28 s): not explained yet, so the value is asserted where the schedule is the harness's.
        if harness_device == "cpu":
            assert any(f.oracle == "differential" and "lmcache_stored_chunk" in f.message
                       for f in result.findings), [f.message for f in result.findings]
    else:
        assert not races
    if target.semantics == "0.5.23":
        assert result.findings == [], [f.message for f in result.findings]


def test_a_replays_padded_rows_are_sglangs_zeros_and_a_registry_that_keeps_them_is_found_stale(
        target, harness_device, monkeypatch):
    """Every release's prefill registry pads a replay's input ids, positions and output slots with 0 (the dummy slot)
    every replay; the replay notes how many padded rows hold anything else. Two breakable replays, the second of
    fewer live tokens (3, padded to 4) than the first (10): clean, no padded row holds anything else. With the
    registry's `GraphSlot.reset_padding` a no-op (every slot keeps its padded tail, as `PaddingPolicy.KEEP_PAD`
    does), the second replay's padded row holds the first replay's token, and `freshness` says so."""
    case = _case(target, Batch(requests=(Request(2, 6), Request(0, 4)), graph=True, mutations=(REWRITE,)),
                 Batch(requests=(Request(1, 3),), graph=True, mutations=(REWRITE,)), contract="bcg")
    clean = run_case(target, case, harness_device, target_spec=SGLANG)
    assert clean.findings == [], [f.message for f in clean.findings]
    replays = [r for batch in clean.overlapped.notes for r in batch if isinstance(r, GraphReplay)]
    assert [(r.bucket, r.tokens, r.stale_padded_rows) for r in replays] == [(12, 10, 0), (4, 3, 0)]
    monkeypatch.setattr(target.api.mods["buffer_registry"].GraphSlot, "reset_padding", lambda self, raw, padded: None)
    kept = run_case(target, case, harness_device, target_spec=SGLANG, oracles=frozenset({"freshness"}))
    stale = [f for f in kept.findings if f.kind == "stale-padding"]
    assert stale and stale[0].batch == 1 and "1 of its 1 padded rows" in stale[0].message, \
        [f.message for f in kept.findings]
