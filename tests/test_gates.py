"""Race gates on a real GPU: a held stream runs nothing until its gate opens; the device opens it
once the scheduler's work has landed, at once when that work waits for the held stream, and the
timer at the deadline when the host blocks on the held stream."""

from __future__ import annotations

import time

import pytest
import torch

pytestmark = pytest.mark.gpu

SECOND_OF_CYCLES = 2_000_000_000  # about a second at an H200's clock: far beyond what the checks take


def _device():
    from harness.device import make_device

    return make_device("cuda")


def _held(device, cycles: int = SECOND_OF_CYCLES) -> None:
    with device.stream(device.forward_stream):
        device.delay(cycles)


def test_a_held_stream_runs_nothing_until_its_gate_opens():
    device = _device()
    seen = torch.zeros(4, device="cuda")
    _held(device)
    with device.stream(device.forward_stream):
        device.launch("write", lambda: seen.fill_(1.0), writes={"seen": None})
        done = torch.cuda.Event()
        done.record(device.native(device.forward_stream))
    time.sleep(0.05)
    assert not done.query(), "the forward stream ran past a closed gate"
    device.synchronize()  # opens the gate first: nothing else is running
    assert seen.tolist() == [1.0] * 4
    (gate,) = device.race_window()["gates"]
    assert gate["opened_by"] == "landed" and gate["held_ms"] < 500


def test_a_scheduler_write_nothing_orders_lands_before_the_held_read():
    device = _device()
    table, seen = torch.ones(1 << 20, device="cuda"), torch.zeros(1 << 20, device="cuda")
    _held(device)
    with device.stream(device.forward_stream):
        device.launch("read", lambda: seen.copy_(table), reads={"table": None}, writes={"seen": None})
    with device.stream(device.schedule_stream):
        device.launch("mutate", lambda: table.fill_(7.0), writes={"table": None})
    device.synchronize()
    assert seen.min().item() == 7.0, "the gate opened before the scheduler's write landed"
    assert device.race_window()["open"] is True
    assert device.tracker.conflicts  # and the tracker names the race


def test_a_gate_the_scheduler_waits_beyond_opens_at_once():
    device = _device()
    table, seen = torch.ones(1 << 20, device="cuda"), torch.zeros(1 << 20, device="cuda")
    _held(device)
    with device.stream(device.forward_stream):
        device.launch("read", lambda: seen.copy_(table), reads={"table": None}, writes={"seen": None})
        event = device.record_event()
    device.wait_event(device.schedule_stream, event)
    with device.stream(device.schedule_stream):
        device.launch("mutate", lambda: table.fill_(7.0), writes={"table": None})
    began = time.perf_counter()
    device.synchronize()
    assert time.perf_counter() - began < 0.5, "a gate the scheduler waits beyond was left to its deadline"
    assert seen.max().item() == 1.0 and table.min().item() == 7.0
    assert [g["opened_by"] for g in device.race_window()["gates"]] == ["awaited"]
    assert not device.tracker.conflicts


def test_a_gate_opens_at_its_deadline_when_the_host_blocks_on_its_stream():
    device = _device()
    ms = 30.0
    seen = torch.zeros(1, device="cuda")
    seen.add_(1)  # loads the kernel: CUDA loads a kernel lazily at its first launch, which waits for the device
    torch.cuda.synchronize()
    _held(device, cycles=int(ms * device.sleep_cycles_per_ms))
    with device.stream(device.forward_stream):
        device.launch("write", lambda: seen.add_(1), writes={"seen": None})
    began = time.perf_counter()
    device.native(device.forward_stream).synchronize()  # not through the device: only the timer opens it
    waited_ms = (time.perf_counter() - began) * 1e3
    assert ms * 0.5 < waited_ms < ms * 20
    device.synchronize()
    window = device.race_window()
    assert [g["opened_by"] for g in window["gates"]] == ["deadline"] and window["open"] is False


def test_a_late_timer_of_an_earlier_gate_never_closes_a_later_one():
    from harness.device.gates import gate_word

    device = _device()
    _held(device)
    _held(device)
    device.synchronize()
    first, second = (gate.number for gate in device._gates)
    gate_word().open(first)  # the first gate's timer, firing after both were opened
    assert gate_word()._cell.value == second
