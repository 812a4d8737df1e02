"""Race windows on CUDA: a stream held at a gate until the host opens it, with no kernel running.

The overlapped run widens a race window by holding the forward stream (before a batch's forward,
and right after each event it records) so that the scheduler's mutations, if nothing orders them
after the forward's reads, really land first. That hold used to be a `torch.cuda._sleep` kernel of
a fixed length (10 or 50 ms): the GPU spun for the whole time, though the scheduler's work had
landed long before, and several processes sharing one GPU took turns through each other's spins.

A gate is `cuStreamWaitValue32` (a CUDA driver stream memory operation) on a word of pinned host
memory: the stream's work behind it waits for the word to reach the gate's number, and no kernel
runs meanwhile. Opening a gate is a plain store into that word, with no CUDA call, so the timer's
thread can open it while the host thread is blocked inside the driver (a word of device memory
raised by `cuStreamWriteValue32` was tried: the timer's driver call then waited for the host
thread's allocation, which waited for the held stream, and neither returned). The device opens its
gates when the host is done issuing a batch (`CudaDevice.open_gates`): each as soon as every other
stream's work has run, or is itself waiting for the held stream beyond the gate (the scheduler that
waits for the forward's event, as it should). A timer (`Deadline`) opens each gate at its deadline,
the old sleep's length, unless the host thread that issued it is still issuing: a host that blocks
on the held stream inside the target (an implicit synchronisation: a pageable copy, a new allocation
of pinned memory, the first launch of a kernel in the process, which CUDA loads lazily) sits in one
driver call, and its gate opens within a tick of the deadline; a host still busy issuing the batch
(its innermost Python frame moves) keeps the window, up to MAX_EXTENSION_S more, so that a batch
which takes longer to issue than the case's window (a loaded host, jobs sharing it) still meets
the gate closed. The old sleep ended at its length whatever the host did.

The driver is reached through ctypes (torch exposes no stream memory operations). A driver
without them is an `EnvironmentBroken` (exit 3) when `--device cuda` is resolved, before any work,
never a window silently left closed.
"""

from __future__ import annotations

import ctypes
import functools
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from harness.errors import EnvironmentBroken

__all__ = ["Deadline", "Gate", "GateWord", "gate_word", "hold", "leaked", "opening", "require_driver"]

PROGRESS_TICK_S = 0.005  # past its deadline, how often a gate's timer looks whether the host still issues
MAX_EXTENSION_S = 1.0  # the longest a busy host keeps a gate closed past its deadline

_CU_STREAM_WAIT_VALUE_GEQ = 0x0  # wait until (int32)(*addr - value) >= 0
_WAIT_VALUE_SYMBOLS = ("cuStreamWaitValue32_v2", "cuStreamWaitValue32")
_HOST_POINTER_SYMBOLS = ("cuMemHostGetDevicePointer_v2", "cuMemHostGetDevicePointer")


@dataclass
class Gate:
    """One hold of a stream, and how it opened (`opening`): by the host (`landed`: the other
    streams' work had run; `awaited`: what is still running waits for the held stream beyond the
    gate), by its timer (`deadline`), or not at all (`leaked`: the stream ran past it while closed)."""

    number: int  # the word's value that opens it
    stream_id: int  # the harness stream it holds
    seq: int  # its place in the tracker's program order of that stream (`HappensBefore.mark`)
    issued_at: float  # host perf_counter seconds
    timer: "Deadline"
    passed: torch.cuda.Event  # recorded on the stream right behind the gate
    opened_by: Optional[str] = None  # None while it holds
    held_s: Optional[float] = None  # host seconds from issue to opening


class GateWord:
    """The process's one word every gate waits on. Gate n opens when the word reaches n: gates are
    numbered in issue order, and opening one opens every earlier one, so a late timer of an earlier
    gate never closes a later one (`open` only raises the word)."""

    def __init__(self) -> None:
        self._wait_value, host_pointer = require_driver()
        self._host = torch.zeros(1, dtype=torch.int32, pin_memory=True)
        self._cell = ctypes.c_uint32.from_address(self._host.data_ptr())
        device_pointer = ctypes.c_uint64()
        _check(host_pointer(ctypes.byref(device_pointer), ctypes.c_void_p(self._host.data_ptr()), ctypes.c_uint(0)),
               "cuMemHostGetDevicePointer (the gate word's address on the GPU)")
        self._device_pointer = device_pointer.value
        self._issued = 0
        self._lock = threading.Lock()

    def hold(self, stream: torch.cuda.Stream) -> int:
        """Holds `stream` from here until the gate the returned number names is opened."""
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("a race gate inside a graph capture is not modelled; hold the stream before capture")
        self._issued += 1
        _check(self._wait_value(ctypes.c_void_p(stream.cuda_stream), ctypes.c_uint64(self._device_pointer),
                                ctypes.c_uint32(self._issued), ctypes.c_uint(_CU_STREAM_WAIT_VALUE_GEQ)),
               "cuStreamWaitValue32 (a race gate)")
        return self._issued

    def open(self, number: int) -> None:
        """A plain store into pinned memory (no CUDA call): safe from the timer's thread."""
        with self._lock:
            if number > self._cell.value:
                self._cell.value = number

    def is_open(self, number: int) -> bool:
        return self._cell.value >= number


_WORD: Optional[GateWord] = None


def gate_word() -> GateWord:
    """The process's gate word, made at the first gate (CUDA is up by then)."""
    global _WORD
    if _WORD is None:
        _WORD = GateWord()
    return _WORD


class Deadline(threading.Thread):
    """The timer of gate `number`: at `deadline_s` it opens the gate, unless the thread that issued
    it (`host_thread`) is still making progress; it then looks every PROGRESS_TICK_S and opens the
    gate at the first look that finds the host where the last one did (blocked in one call: the
    driver waiting for the held stream, as likely as not), or MAX_EXTENSION_S past the deadline.
    `cancel()` when the host opens the gate itself."""

    def __init__(self, word: GateWord, number: int, deadline_s: float, host_thread: int,
                 where: Callable[[int], object]):
        super().__init__(name=f"race-gate-{number}", daemon=True)
        self.word, self.number, self.deadline_s, self.host_thread = word, number, deadline_s, host_thread
        self.where = where
        self.cancelled = threading.Event()

    def cancel(self) -> None:
        self.cancelled.set()

    def run(self) -> None:
        if self.cancelled.wait(self.deadline_s):
            return
        extended_until = time.perf_counter() + MAX_EXTENSION_S
        last = self.where(self.host_thread)
        while not self.cancelled.wait(PROGRESS_TICK_S):
            now = self.where(self.host_thread)
            if now == last or time.perf_counter() >= extended_until:
                self.word.open(self.number)
                return
            last = now


def host_position(thread: int) -> Optional[tuple[int, int, int]]:
    """Where `thread` is: its innermost Python frame and the instruction in it. The same position at
    two looks PROGRESS_TICK_S apart means the thread sat in one call (a C call: the driver's) meanwhile."""
    frame = sys._current_frames().get(thread)
    return None if frame is None else (id(frame.f_code), id(frame), frame.f_lasti)


def hold(word: GateWord, stream: torch.cuda.Stream, stream_id: int, seq: int, deadline_s: float) -> Gate:
    """A gate on `stream`, with its timer started (`Deadline`): it opens after `deadline_s`, or
    later while this thread goes on issuing."""
    number = word.hold(stream)
    passed = torch.cuda.Event()
    torch._C._CudaEventBase.record(passed, stream)  # the harness's own: not a target's event to track
    timer = Deadline(word, number, deadline_s, threading.get_ident(), host_position)
    timer.start()
    return Gate(number, stream_id, seq, time.perf_counter(), timer, passed)


def opening(*, leaked: bool, timed_out: bool, running: Sequence[int], awaits_gate: Callable[[int], bool]) -> Optional[str]:
    """How a closed gate opens now, or None to hold it a little longer. `running`: the other streams
    whose issued work has not finished; `awaits_gate(stream)`: whether that stream's work is ordered
    after the held stream's work beyond the gate (the tracker's clocks), so it waits for the gate."""
    if leaked:
        return "leaked"
    if timed_out:
        return "deadline"
    if not running:
        return "landed"
    if all(awaits_gate(stream) for stream in running):
        return "awaited"
    return None


def leaked(gate: Gate, word: GateWord) -> bool:
    """Whether the stream ran past the gate while it was still closed (the self-check of each gate)."""
    return not word.is_open(gate.number) and gate.passed.query()


@functools.lru_cache(maxsize=1)
def require_driver():
    """The driver's stream wait and host pointer lookup, the two calls a gate makes; refuses a run on
    CUDA before any work (`resolve_device`) when the driver lacks either."""
    driver = _driver()
    return _symbol(driver, _WAIT_VALUE_SYMBOLS), _symbol(driver, _HOST_POINTER_SYMBOLS)


def _driver() -> ctypes.CDLL:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise EnvironmentBroken(f"race gates need the CUDA driver library (libcuda.so.1): {exc}") from None


def _symbol(driver: ctypes.CDLL, names: tuple[str, ...]):
    for name in names:
        function = getattr(driver, name, None)
        if function is not None:
            return function
    raise EnvironmentBroken(f"race gates need the CUDA driver's {names[-1]} (stream memory operations, CUDA 11.7 or "
                            "later); this driver has none of: " + ", ".join(names))


def _check(result: int, what: str) -> None:
    if result != 0:
        raise EnvironmentBroken(f"{what} failed with CUresult {result}")
