"""CSAN as a second opinion: the verdict logic on synthetic opinions (CPU), and on real streams (GPU)."""

from __future__ import annotations

import pytest
import torch

from harness.csan import GRAPH_BLIND, Opinions, summarise


def opinions(hb=(), csan=(), differential=(), graph_replays=0, triton=False) -> Opinions:
    return Opinions("case", "python -m harness replay ...", list(hb), list(differential), list(csan), graph_replays,
                    triton)


def test_verdicts_and_known_blind_spots():
    assert opinions().verdict == "agree-clean"
    assert opinions(hb=["race"], csan=["race"]).verdict == "agree-race"
    graph = opinions(hb=["race on 'req_to_token': read by 'x' (seq 3, graph 'prefill_graph[12].layer0')"])
    assert graph.verdict == "ours-only" and graph.explanation == GRAPH_BLIND
    plain = opinions(hb=["race on 'req_to_token': read by 'x' on stream 1001"])
    assert plain.verdict == "ours-only" and plain.explanation is None  # unexplained: investigate
    assert opinions(csan=["write after read"]).verdict == "csan-only"


def test_summary_counts_unexplained_disagreements_only():
    summary = summarise([opinions(), opinions(hb=["graph 'g'"]), opinions(csan=["w"]), opinions(differential=["d"])])
    assert summary["verdicts"] == {"agree-clean": 2, "ours-only": 1, "csan-only": 1}
    assert summary["unexplained"] == 1 and summary["differential_findings"] == 1
    assert [d["verdict"] for d in summary["disagreements"]] == ["ours-only", "csan-only"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_csan_without_cuda_is_a_broken_environment():
    from harness.csan import CsanObserver
    from harness.errors import EnvironmentBroken

    with pytest.raises(EnvironmentBroken, match="CSAN needs a CUDA device"):
        CsanObserver()


@pytest.mark.gpu
def test_csan_agrees_on_a_late_read_and_is_blind_to_one_inside_a_graph_replay():
    from harness.csan import CsanObserver
    from harness.device import make_device

    observer = CsanObserver()

    def program(in_graph: bool):
        device = make_device("cuda")
        table, seen = torch.ones(1 << 16, device="cuda"), torch.zeros(1 << 16, device="cuda")
        read = lambda: seen.copy_(table)  # noqa: E731
        with device.stream(device.forward_stream), device.capture("late_read") as graph:
            device.launch("late_read", read, reads={"table": None}, writes={"seen": None})
        device.synchronize()
        with observer.observing() as errors:  # graphs are captured at start-up; CSAN watches the serving
            with device.stream(device.forward_stream):
                event = device.record_event()
                if in_graph:
                    device.replay(graph)
                else:
                    device.launch("late_read", read, reads={"table": None}, writes={"seen": None})
            device.wait_event(device.schedule_stream, event)
            with device.stream(device.schedule_stream):
                device.launch("mutate", lambda: table.zero_(), writes={"table": None})
            device.synchronize()
            return len(device.tracker.conflicts), list(errors)

    ours, theirs = program(in_graph=False)
    assert ours == 1 and theirs, "CSAN and our tracker both see a plain late read"
    ours, theirs = program(in_graph=True)
    assert ours == 1 and not theirs, "only our tracker sees the read inside the graph replay"
