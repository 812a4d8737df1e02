"""Real `torch.cuda.CUDAGraph`s: a capture records without running, a replay reads by address, and the
tracker receives each replay's accesses and edges."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu


def test_a_replay_reads_its_inputs_by_address_and_the_capture_runs_nothing():
    from harness.device import make_device

    device = make_device("cuda")
    src, dst = torch.arange(8.0, device="cuda"), torch.zeros(8, device="cuda")
    with device.stream(device.forward_stream):
        with device.capture("copy") as graph:
            device.launch("copy", lambda: dst.copy_(src * 2), reads={"src": None}, writes={"dst": None})
        device.synchronize()
        assert isinstance(graph.native, torch.cuda.CUDAGraph)
        assert dst.sum().item() == 0  # captured, not run
        src.fill_(5)
        device.replay(graph)
    device.synchronize()
    assert dst.tolist() == [10.0] * 8


def test_the_tracker_sees_a_replay_that_races_a_scheduler_write():
    from harness.device import make_device

    device = make_device("cuda")
    table, seen = torch.ones(1 << 16, device="cuda"), torch.zeros(1 << 16, device="cuda")
    with device.stream(device.forward_stream):
        with device.capture("late_read") as graph:
            device.launch("late_read", lambda: seen.copy_(table), reads={"table": None}, writes={"seen": None})
        event = device.record_event()
        device.replay(graph)
    device.wait_event(device.schedule_stream, event)
    with device.stream(device.schedule_stream):
        device.launch("mutate", lambda: table.zero_(), writes={"table": None})
    device.synchronize()
    assert len(device.tracker.conflicts) == 1 and device.tracker.conflicts[0].later.graph is None
    assert device.tracker.conflicts[0].earlier.graph == "late_read"


def _graph_case(**kw):
    from harness.case import Batch, Case, Mutation, Request

    mutations = (Mutation("swa_clear", count=4), Mutation("req_to_token_rewrite", count=2))
    return Case(delay_cycles=20_000_000, batches=(
        Batch(requests=(Request(9, 6), Request(3, 4)), graph=True, mutations=mutations),
        Batch(requests=(Request(9, 6), Request(3, 4)), graph=True, mutations=mutations)), **kw)


def test_graph_cases_replay_real_graphs_at_the_padded_bucket_and_stay_clean():
    from harness.engine import run_case
    from harness.targets import ReferenceTarget
    from harness.targets.protocol import GraphReplay

    result = run_case(ReferenceTarget(), _graph_case(), "cuda")
    replays = [r for notes in result.overlapped.notes for r in notes if isinstance(r, GraphReplay)]
    assert replays and all(r.bucket == 12 and r.tokens == 10 for r in replays)
    assert not result.findings, [f.message for f in result.findings]


def test_a_live_read_inside_a_real_graph_replay_is_caught_and_the_window_is_recorded():
    from harness.engine import run_case
    from harness.mutants.corpus import mutant_target

    result = run_case(mutant_target("in_graph_live_metadata"), _graph_case(), "cuda")
    hb = [f for f in result.findings if f.oracle == "happens-before"]
    assert hb, [f.message for f in result.findings]
    window = hb[0].details["race_window"]
    assert window["delay_cycles"] == 20_000_000 and window["delay_ms"] > 0 and window["issue_gap_ms"] is not None
