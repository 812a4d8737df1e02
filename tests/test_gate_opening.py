"""When a race gate opens (`harness.device.gates.opening`), judged on the happens-before tracker's
clocks with synthetic stream and event ids, as the device judges them between its polls."""

from __future__ import annotations

import pytest

from harness.device.gates import opening
from harness.hb import HappensBefore

FORWARD, SCHEDULE, COPY = 1001, 1002, 1003
EVENT_BEFORE, EVENT_AFTER = 2001, 2002


@pytest.fixture
def held() -> tuple[HappensBefore, int]:
    """The forward stream held at a gate, an event recorded on each side of it."""
    hb = HappensBefore()
    hb.launch(FORWARD, "previous batch", writes={"table": None})
    hb.record(EVENT_BEFORE, FORWARD)
    gate = hb.mark(FORWARD)
    hb.launch(FORWARD, "forward", reads={"table": None})
    hb.record(EVENT_AFTER, FORWARD)
    return hb, gate


def _opening(hb: HappensBefore, gate: int, running, *, leaked=False, timed_out=False):
    return opening(leaked=leaked, timed_out=timed_out, running=running,
                   awaits_gate=lambda stream: hb.reached(stream, FORWARD, gate))


def test_a_scheduler_that_waits_for_the_forward_opens_the_gate_at_once(held):
    hb, gate = held
    hb.wait(SCHEDULE, EVENT_AFTER)
    assert _opening(hb, gate, [SCHEDULE]) == "awaited"


def test_a_scheduler_that_waits_on_the_stale_event_holds_the_gate_until_its_work_lands(held):
    hb, gate = held
    hb.wait(SCHEDULE, EVENT_BEFORE)  # a stale event: its write may overtake the forward's read
    assert _opening(hb, gate, [SCHEDULE]) is None
    assert _opening(hb, gate, []) == "landed"


def test_every_running_stream_must_wait_for_the_gate_before_it_opens_early(held):
    hb, gate = held
    hb.wait(SCHEDULE, EVENT_AFTER)
    assert _opening(hb, gate, [SCHEDULE, COPY]) is None  # the copy stream's work is still landing
    hb.record(3001, SCHEDULE)
    hb.wait(COPY, 3001)  # ordered after the forward through the scheduler
    assert _opening(hb, gate, [SCHEDULE, COPY]) == "awaited"


def test_a_leak_and_a_deadline_are_named_whatever_else_holds(held):
    hb, gate = held
    assert _opening(hb, gate, [SCHEDULE], timed_out=True) == "deadline"
    assert _opening(hb, gate, [], leaked=True, timed_out=True) == "leaked"


def test_a_driver_that_cannot_hold_a_gate_is_refused_naming_what_it_lacks(monkeypatch):
    import ctypes

    from harness.device import gates
    from harness.errors import EnvironmentBroken

    def no_library(name):
        raise OSError(f"{name}: cannot open shared object file")

    class OldDriver:  # the wait, but not the host pointer lookup
        cuStreamWaitValue32 = object()

    for fake, needle in ((no_library, "libcuda.so.1: cannot open"), (lambda name: OldDriver(),
                                                                       "cuMemHostGetDevicePointer")):
        gates.require_driver.cache_clear()
        monkeypatch.setattr(ctypes, "CDLL", fake)
        with pytest.raises(EnvironmentBroken, match=needle):
            gates.require_driver()
    gates.require_driver.cache_clear()
