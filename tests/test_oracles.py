"""Every oracle fires on a planted bug and stays quiet on the clean reference, on the same case."""

from __future__ import annotations

import pytest
import torch

from harness.case import Batch, Case, Flags, Mutation, Request
from harness import engine
from harness.engine import run_case
from harness.errors import EnvironmentBroken
from harness.model.backend import DeepseekV4AttnBackend
from harness.model.enums import ForwardMode, SharedReadEnds
from harness.model.runners import ModelRunner
from harness.mutants.corpus import mutant_target
from harness.policy import expected_publish, runs_graph
from harness.probe import GraphReplay, Publish
from harness.sglang_target.differential import describe_difference
from harness.targets import Classes, ReferenceTarget, Target

PLAIN = Case(batches=(Batch(requests=(Request(5, 3),), mutations=(Mutation("req_to_token_rewrite"),)),))
GRAPH = Case(batches=(Batch(requests=(Request(5, 3), Request(0, 2)), graph=True,
                            mutations=(Mutation("swa_clear", count=3),)),))

PLANTED = [
    ("differential", "scheduler_no_wait", PLAIN),
    ("happens-before", "scheduler_no_wait", PLAIN),
    ("policy", "fast_path_lost", PLAIN),
    ("fast-path", "event_after_layers", PLAIN),
    ("float64", "padded_rows_live_slot", GRAPH),
    ("kv", "padded_rows_live_slot", GRAPH),
    ("execution", "missing_token_to_kv_pool", PLAIN),
]


@pytest.mark.parametrize("oracle,mutant,case", PLANTED, ids=[p[0] for p in PLANTED])
def test_oracle_fires_on_its_planted_bug_and_not_on_the_clean_reference(oracle, mutant, case):
    only = frozenset({oracle})
    assert run_case(ReferenceTarget(), case, oracles=only).findings == []
    findings = run_case(mutant_target(mutant), case, oracles=only).findings
    assert findings and {f.oracle for f in findings} == {oracle}


def test_a_mutation_that_never_ran_is_a_finding():
    case = Case(flags=Flags(hisparse=True), batches=(Batch(requests=(Request(0, 2),),
                                                           mutations=(Mutation("hisparse_evict"),)),))
    assert run_case(ReferenceTarget(), case).findings == []  # it evicts plain slots when no block exists


    from harness import mutator

    original = mutator.Mutator._hisparse_evict
    mutator.Mutator._hisparse_evict = lambda self, m: None
    try:
        kinds = [f.kind for f in run_case(ReferenceTarget(), case).findings]
    finally:
        mutator.Mutator._hisparse_evict = original
    assert kinds == ["mutation-never-ran"]


def test_a_finding_names_the_request_row_and_values():
    finding = run_case(mutant_target("scheduler_no_wait"), PLAIN, oracles=frozenset({"differential"})).findings[0]
    assert "request 0" in finding.message and "position" in finding.message and "overlapped" in finding.message


class ComparedWithTheModel(Target):
    """A target that is not the model, compared with it as the sglang target is (`reference` oracle)."""

    def __init__(self, inner):
        self.inner, self.name = inner, inner.name

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def open(self, case, device):
        return self.inner.open(case, device)

    def reference_differences(self, case, device_name):
        from harness.sglang_target.differential import differential_details

        return differential_details(case, target=self.inner, device=device_name)


class VerifyDeclaresPreReplay(ReferenceTarget):
    """A backend whose target-verify declares its reads done before the replay: no race any prefill
    case can show (the decode graph runner acts on it), so only the declaration differs."""

    def open(self, case, device):
        session = super().open(case, device)
        backend = session.model_runner.attn_backend
        declared = backend.shared_read_ends
        backend.shared_read_ends = lambda mode: (SharedReadEnds.PRE_REPLAY if mode is ForwardMode.TARGET_VERIFY
                                                 else declared(mode))
        return session


@pytest.mark.parametrize("planted, field, seen_otherwise", [
    (lambda: mutant_target("fast_path_lost"), "publish", True),
    (VerifyDeclaresPreReplay, "shared_read_ends(TARGET_VERIFY)", False),
], ids=["fast_path_lost", "verify_declares_pre_replay"])
def test_reference_oracle_names_the_field_where_a_target_leaves_the_model(planted, field, seen_otherwise):
    only = frozenset({"reference"})
    assert run_case(ComparedWithTheModel(ReferenceTarget()), PLAIN, oracles=only).findings == []
    assert bool(run_case(planted(), PLAIN).findings) is seen_otherwise
    findings = run_case(ComparedWithTheModel(planted()), PLAIN, oracles=only).findings
    assert findings and {f.oracle for f in findings} == {"reference"}
    assert any(f"differ in {field}:" in f.message for f in findings), [f.message for f in findings]


def test_reference_oracle_reports_a_target_that_raises_while_compared():
    class Raising(ComparedWithTheModel):
        def reference_differences(self, case, device_name):
            raise KeyError("forward_metadata")

    [finding] = run_case(Raising(ReferenceTarget()), PLAIN, oracles=frozenset({"reference"})).findings
    assert finding.kind == "target-raised" and "KeyError" in finding.message


def test_reference_oracle_is_silent_for_the_model_itself():
    assert ReferenceTarget().reference_differences(PLAIN, "cpu") == {}
    assert run_case(ReferenceTarget(), PLAIN, oracles=frozenset({"reference", "contract"})).findings == []


def test_index_rows_padded_with_skipped_columns_compare_by_their_entries():
    import torch

    from harness.sglang_target.differential import _trim_skipped_columns

    narrow = torch.tensor([[0, -1], [0, 1]])
    wide = torch.tensor([[0, -1, -1, -1], [0, 1, -1, -1]])
    assert [t.tolist() for t in _trim_skipped_columns(wide, narrow)] == [narrow.tolist(), narrow.tolist()]
    extra_entry = torch.tensor([[0, -1, -1, -1], [0, 1, 2, -1]])
    assert _trim_skipped_columns(extra_entry, narrow)[0].shape == (2, 4), "a real entry past the width is kept"


def test_a_graph_replays_padded_query_rows_compare_by_the_live_rows():
    """SGLang's graph attention op builds the chunk cache for the live rows, the reference model for the bucket: the
    reference's extra rows are padding (no index, length 0, position 0) and are not compared; a padded row that
    carries an entry, or rows of a field that is not per query, still differ."""
    import torch

    from harness.sglang_target.differential import _trim_padding_rows, _trim_skipped_columns

    live = torch.tensor([[3, -1], [3, 4]])
    bucket = torch.tensor([[3, -1, -1], [3, 4, -1], [-1, -1, -1]])
    x, y = _trim_skipped_columns(*_trim_padding_rows("c0_combined_indices", live, bucket))
    assert torch.equal(x, y)
    assert [t.shape[0] for t in _trim_padding_rows("c0_combined_lens", torch.tensor([2, 1]),
                                                   torch.tensor([2, 1, 0]))] == [2, 2]
    entry = torch.tensor([[3, -1, -1], [3, 4, -1], [5, -1, -1]])
    assert _trim_padding_rows("c0_combined_indices", live, entry)[1].shape[0] == 3, "a padded row with an entry"
    assert _trim_padding_rows("swa_token_ids", torch.tensor([7, 8]), torch.tensor([7, 8, -1]))[1].shape[0] == 3


def test_contract_oracle_reports_each_static_break_of_a_target():
    class Broken(ComparedWithTheModel):
        def contract_breaks(self):
            return ["Backend.token_to_kv_pool is never assigned in Backend or its bases; read by forward at b.py:9"]

    only = frozenset({"contract"})
    [finding] = run_case(Broken(ReferenceTarget()), PLAIN, oracles=only).findings
    assert finding.oracle == "contract" and "Backend.token_to_kv_pool" in finding.message and "b.py:9" in finding.message
    assert run_case(ReferenceTarget(), PLAIN, oracles=only).findings == []


def test_the_reference_oracles_difference_names_the_first_differing_entry():
    """A 12x128 index table once came back whole in the message; now the first difference, its row."""
    real, model = torch.full((12, 128), -1), torch.full((8, 128), -1)
    assert describe_difference(real, model) == ("equal where both have entries; sglang has more, from row 8: "
                                      f"{[-1] * 16} (shapes (12, 128) / (8, 128))")
    model[3, 5] = 7
    assert describe_difference(real, model).startswith("first at [3, 5]: sglang -1 vs reference 7; that row: sglang [-1,")


def test_float64_allows_a_bf16_output_its_rounding_and_nothing_more():
    """A bf16 attention (what SGLang's DSV4 kernels return) passes with its own rounding (2^-7 of the value
    beyond FLOAT64_ATOL); an error above that is a mismatch naming the tolerance; float32 gets FLOAT64_ATOL only."""
    from harness.engine import execute
    from harness.oracles.float64 import float64_oracle

    run = execute(ReferenceTarget(), PLAIN, "cpu", barriered=True)
    exact = run.outputs[0]["attention"]
    assert float64_oracle(PLAIN, run) == []
    run.outputs[0]["attention"] = exact.to(torch.bfloat16)  # rounded: about 2^-8 of the value off
    assert float64_oracle(PLAIN, run) == []
    assert (exact.to(torch.bfloat16).double() - exact.double()).abs().max() > 1e-4  # more than float32 may be off
    run.outputs[0]["attention"] = exact + 3e-4 * exact.abs().max()  # float32: beyond FLOAT64_ATOL
    [finding] = float64_oracle(PLAIN, run)
    assert finding.details["tolerance"] == "0.0001"
    off = exact.clone()
    off[0, 1, 0, :4] *= 1.05  # bf16-sized values, 5% off in one row
    run.outputs[0]["attention"] = off.to(torch.bfloat16)
    [finding] = float64_oracle(PLAIN, run)
    assert "x |reference|" in finding.details["tolerance"] and finding.details["token_row"] == 1


def test_a_target_that_raises_opening_its_session_is_a_finding():
    """A target's own constructor failing (0.5.23's backend runs its __init__: a deleted assignment there raises)
    is the target's finding, with the case's replay, never a harness traceback."""

    class Unbuildable(Target):
        def open(self, case, device):
            raise AttributeError("'DeepseekV4AttnBackend' object has no attribute 'token_to_kv_pool'")

    result = run_case(Unbuildable(), PLAIN, "cpu")
    assert [(f.oracle, f.kind) for f in result.findings] == [("execution", "target-raised")]
    assert "opening the session: AttributeError" in result.findings[0].message and result.replay


class _OutOfMemory(ReferenceTarget):
    """A target whose device runs out of memory: opening its session, stepping a batch, its pool's state read after
    a batch (the harness's copy), or asked by the reference oracle (`where`)."""

    def __init__(self, where):
        super().__init__()
        self.where = where

    def _fail(self):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of "
                                     "79.18 GiB of which 1.06 MiB is free.")

    def open(self, case, device):
        if self.where == "open":
            self._fail()
        session = super().open(case, device)
        if self.where == "step":
            session.step = lambda *args, **kwargs: self._fail()
        if self.where == "kv_state":
            session.kv_state = self._fail
        return session

    def reference_differences(self, case, device_name):
        self._fail()


@pytest.mark.parametrize("where", ["open", "step", "kv_state", "reference"])
def test_a_device_out_of_memory_is_the_machines_state_never_a_finding(where):
    """A failed device allocation (an H100 shared by a campaign's children and another campaign) says nothing about
    the target: the run cannot vouch (exit 3) and names what to do; it is no `target-raised` finding (exit 1)."""
    with pytest.raises(EnvironmentBroken, match="ran out of memory during the case .*CUDA out of memory.*--jobs") as e:
        run_case(_OutOfMemory(where), PLAIN, "cpu")
    assert e.value.exit_code == 3


class _Unbuildable(Target):
    """A target whose session cannot be built: raised two frames down, so the finding must name the inner line."""

    opened = 0

    def open(self, case, device):
        _Unbuildable.opened += 1
        return self._build()

    def _build(self):
        raise IndexError("index 1073741824 is out of bounds for dimension 0 with size 1793")


def test_a_target_crash_names_the_line_it_was_raised_at():
    """The finding carries where the target raised (on CUDA with CUDA_LAUNCH_BLOCKING=1, the op that failed on the
    device, and the lines outside torch that called it): a crash is located without a debugger."""
    [finding] = run_case(_Unbuildable(), PLAIN, "cpu").findings
    assert "IndexError: index 1073741824" in finding.message
    assert "(raised at tests/test_oracles.py:" in finding.message and "in _build)" in finding.message


def test_an_overlapped_crash_that_loses_the_cuda_context_is_the_finding_and_the_barriered_run_is_not_started(
        monkeypatch):
    """A device-side assert leaves the process's CUDA context unusable: the barriered run would fail wherever it
    first touched the device (it once failed in the device's warm-up, and the overlapped run's message was lost).
    The overlapped run's crash is then the one finding, with its message."""
    monkeypatch.setattr(engine, "context_error", lambda device_name: "CUDA error: device-side assert triggered")
    _Unbuildable.opened = 0
    [finding] = run_case(_Unbuildable(), PLAIN, "cpu").findings
    assert (finding.oracle, finding.kind) == ("execution", "context-lost")
    assert "IndexError: index 1073741824" in finding.message and "barriered run could not be judged" in finding.message
    assert _Unbuildable.opened == 1


def test_a_cp_server_shards_only_a_batch_as_long_as_its_ranks_and_replays_no_prefill_graph():
    """SGLang's interleave CP shards an EXTEND or MIXED batch of at least as many tokens as ranks (its `can_apply`),
    and a DSV4 CP server has no prefill graph (its server resolution turns it off under CP): in the reference model a
    CP case's one-token extend is planned, snapshotted and published as without CP, and its graph batch runs
    eagerly. The policy says the same, so the clean reference is quiet, and a reference whose snapshot gate asks
    the server instead of the batch is found by the policy oracle."""

    flags = Flags(SGLANG_ENABLE_PREFILL_WAR_READ_DONE=True, cp_active=True)
    below, sharded = Batch(requests=(Request(9, 1),)), Batch(requests=(Request(9, 2),), graph=True)
    case = Case(flags=flags, batches=(sharded, below))
    assert expected_publish(case, below) == (True, "EXTEND with the snapshot built, no gate closed")
    assert expected_publish(case, sharded)[0] is False and not runs_graph(case, sharded)
    result = run_case(ReferenceTarget(), case)
    assert result.findings == [], [f.message for f in result.findings]
    notes = result.overlapped.notes
    assert [any(isinstance(r, Publish) for r in batch) for batch in notes] == [False, True]
    assert not any(isinstance(r, GraphReplay) for batch in notes for r in batch)

    class ServerGate(DeepseekV4AttnBackend):
        def _snapshot_prefill_shared_reads(self, forward_batch, *, num_qo_tokens):
            if self.model_runner.flags.cp_active:
                return SharedReadEnds.UNKNOWN
            return super()._snapshot_prefill_shared_reads(forward_batch, num_qo_tokens=num_qo_tokens)

    server_gate = ReferenceTarget(Classes(model_runner=type("ServerGateRunner", (ModelRunner,),
                                                            {"backend_cls": ServerGate})))
    found = run_case(server_gate, case, oracles=("policy",)).findings
    assert [f.kind for f in found] == ["missed-fast-path"], [f.message for f in found]
