"""A race gate's timer (`harness.device.gates.Deadline`): at its deadline it opens the gate unless the
host that issued it is still issuing, and opens it as soon as the host sits in one call. Run on the
CPU with a stand-in word and synthetic host positions; tests/test_gates.py holds real gates on a GPU."""

from __future__ import annotations

import threading
import time
from itertools import count

import pytest

from harness.device import gates
from harness.device.gates import Deadline, host_position

DEADLINE_S = 0.02


class _Word:
    """The gate word's `open`, timed."""

    def __init__(self):
        self.opened_at = None
        self.opened = threading.Event()

    def open(self, number):
        self.opened_at = time.perf_counter()
        self.opened.set()


def _timer(where) -> tuple[Deadline, _Word, float]:
    word = _Word()
    timer = Deadline(word, 1, DEADLINE_S, threading.get_ident(), where)
    began = time.perf_counter()
    timer.start()
    return timer, word, began


def test_a_host_that_sits_in_one_call_gets_its_gate_opened_at_the_deadline():
    timer, word, began = _timer(lambda thread: ("driver call", 0))
    assert word.opened.wait(5)
    assert DEADLINE_S <= word.opened_at - began < DEADLINE_S + 20 * gates.PROGRESS_TICK_S


def test_a_host_still_issuing_keeps_its_gate_closed_past_the_deadline_until_it_stops():
    moves = count()
    issuing_until = time.perf_counter() + 10 * DEADLINE_S
    timer, word, began = _timer(lambda thread: next(moves) if time.perf_counter() < issuing_until else "done")
    assert not word.opened.wait(8 * DEADLINE_S), "the gate opened while the host was still issuing"
    assert word.opened.wait(5)
    assert word.opened_at >= issuing_until


def test_a_host_that_never_stops_moving_is_cut_off(monkeypatch):
    monkeypatch.setattr(gates, "MAX_EXTENSION_S", 0.1)
    moves = count()
    timer, word, began = _timer(lambda thread: next(moves))
    assert word.opened.wait(5)
    assert DEADLINE_S + 0.1 <= word.opened_at - began < DEADLINE_S + 2.0


def test_a_gate_the_host_opened_is_never_opened_by_its_timer():
    timer, word, began = _timer(lambda thread: ("driver call", 0))
    timer.cancel()
    timer.join(5)
    assert not timer.is_alive() and word.opened_at is None


@pytest.mark.parametrize("busy", [False, True])
def test_the_host_position_stays_put_in_a_c_call_and_moves_in_python(busy):
    started, stop = threading.Event(), threading.Event()

    def host():
        started.set()
        if busy:
            total = 0
            while not stop.is_set():
                total += sum(range(50))
        else:
            stop.wait()  # one blocking call, as a driver call that waits for the held stream

    thread = threading.Thread(target=host)
    thread.start()
    started.wait()
    time.sleep(0.01)
    # A busy thread needs the CPU to move: on a loaded machine (CI's two cores, both xdist workers busy) it may
    # not run for a few ticks, so it gets up to 50 looks to show a move; a blocked one must show none in 5.
    looks = [host_position(thread.ident)]
    for _ in range(50 if busy else 5):
        time.sleep(gates.PROGRESS_TICK_S)
        looks.append(host_position(thread.ident))
        if looks[-1] != looks[0]:
            break
    stop.set()
    thread.join()
    same = all(look == looks[0] for look in looks)
    assert same is not busy
