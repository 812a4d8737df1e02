"""Race windows on CUDA: a stream held at a gate until the host opens it, with no kernel running.

The overlapped run widens a race window by holding the forward stream (before a batch's forward,
and right after each event it records) so that the scheduler's mutations, if nothing orders them
after the forward's reads, really land first. That hold used to be a `torch.cuda._sleep` kernel of
a fixed length (10 or 50 ms): the GPU spun for the whole time, though the scheduler's work had
landed long before, and several processes sharing one GPU took turns through each other's spins.

A gate is `cuStreamWaitValue32` (a CUDA driver stream memory operation) on a word of device
memory: the stream's work behind it waits for the word to reach the gate's number, and no kernel
runs meanwhile. The word is raised by `cuStreamWriteValue32` on a stream of the harness's own,
created through the driver so that no stream of torch's pool (which a later run's forward stream
may be) can ever queue it behind a held stream. A word of pinned host memory, written by the host,
was tried first: on the H200 the GPU did not see a write made while the stream already waited, and
the stream stayed held. The device opens its gates when the host is done issuing a batch
(`CudaDevice.open_gates`): each as soon as every other stream's work has run, or is itself waiting
for the held stream beyond the gate (the scheduler that waits for the forward's event, as it
should). A timer opens each gate at its deadline whatever happens, the old sleep's length: a host
that blocks on the held stream inside the target (an implicit synchronisation) waits no longer than
it did behind the sleep.

The driver is reached through ctypes (torch exposes no stream memory operations). A driver
without them is an `EnvironmentBroken` at the first gate, never a window silently left closed.
"""

from __future__ import annotations

import ctypes
import threading
import time
from dataclasses import dataclass
from typing import Optional

import torch

from harness.errors import EnvironmentBroken

__all__ = ["Gate", "GateWord", "gate_word"]

_CU_STREAM_WAIT_VALUE_GEQ = 0x0  # wait until (int32)(*addr - value) >= 0
_CU_STREAM_NON_BLOCKING = 0x1  # the opener stream does not wait for the legacy default stream
_DRIVER_FUNCTIONS = ("cuCtxGetCurrent", "cuCtxSetCurrent", "cuStreamCreate", "cuStreamWaitValue32_v2",
                     "cuStreamWriteValue32_v2")


@dataclass
class Gate:
    """One hold of a stream: opened by the host (`landed`: the other streams' work had run;
    `awaited`: what is still running waits for the held stream beyond the gate) or by its timer
    (`deadline`)."""

    number: int  # the word's value that opens it
    stream_id: int  # the harness stream it holds
    seq: int  # its place in the tracker's program order of that stream (`HappensBefore.mark`)
    issued_at: float  # host perf_counter seconds
    timer: threading.Timer
    opened_by: Optional[str] = None
    held_s: Optional[float] = None  # host seconds from issue to opening


class GateWord:
    """The process's one word every gate waits on. Gate n opens when the word reaches n: gates are
    numbered in issue order, and opening one opens every earlier one. `open` only ever raises the
    word (a late timer of an earlier gate never closes a later one): the writes are queued on the
    opener stream in the order the host asked for them, each higher than the last."""

    def __init__(self) -> None:
        self._cuda = _driver()
        self._word = torch.zeros(1, dtype=torch.int32, device="cuda")  # never freed: gates wait on it
        self._context = ctypes.c_void_p()
        _check(self._cuda.cuCtxGetCurrent(ctypes.byref(self._context)), "cuCtxGetCurrent")
        self._opener = ctypes.c_void_p()
        _check(self._cuda.cuStreamCreate(ctypes.byref(self._opener), ctypes.c_uint(_CU_STREAM_NON_BLOCKING)),
               "cuStreamCreate (the race gates' opener stream)")
        self._issued = 0
        self._opened = 0
        self._lock = threading.Lock()

    def hold(self, stream: torch.cuda.Stream) -> int:
        """Holds `stream` from here until the gate the returned number names is opened."""
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("a race gate inside a graph capture is not modelled; hold the stream before capture")
        self._issued += 1
        _check(self._cuda.cuStreamWaitValue32_v2(ctypes.c_void_p(stream.cuda_stream), self._address(),
                                                 ctypes.c_uint32(self._issued),
                                                 ctypes.c_uint(_CU_STREAM_WAIT_VALUE_GEQ)),
               "cuStreamWaitValue32 (a race gate)")
        return self._issued

    def open(self, number: int) -> None:
        """From the host thread or the timer's (the driver call makes the process's context current)."""
        with self._lock:
            if number <= self._opened:
                return
            _check(self._cuda.cuCtxSetCurrent(self._context), "cuCtxSetCurrent")
            _check(self._cuda.cuStreamWriteValue32_v2(self._opener, self._address(), ctypes.c_uint32(number),
                                                      ctypes.c_uint(0)),
                   "cuStreamWriteValue32 (opening a race gate)")
            self._opened = number

    def is_open(self, number: int) -> bool:
        """Whether its opening was asked for (the word is raised on the GPU right after)."""
        return self._opened >= number

    def _address(self) -> ctypes.c_uint64:
        return ctypes.c_uint64(self._word.data_ptr())


_WORD: Optional[GateWord] = None


def gate_word() -> GateWord:
    """The process's gate word, made at the first gate (CUDA is up by then)."""
    global _WORD
    if _WORD is None:
        _WORD = GateWord()
    return _WORD


def hold(word: GateWord, stream: torch.cuda.Stream, stream_id: int, seq: int, deadline_s: float) -> Gate:
    """A gate on `stream`, with its timer started: it opens after `deadline_s` at the latest."""
    number = word.hold(stream)
    timer = threading.Timer(deadline_s, word.open, (number,))
    timer.daemon = True
    timer.start()
    return Gate(number, stream_id, seq, time.perf_counter(), timer)


def _driver() -> ctypes.CDLL:
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise EnvironmentBroken(f"race gates need the CUDA driver library (libcuda.so.1): {exc}") from None
    for name in _DRIVER_FUNCTIONS:
        if not hasattr(driver, name):
            raise EnvironmentBroken(f"race gates need the CUDA driver's {name} (stream memory operations come with "
                                    "CUDA 11.7 and later); this driver has none")
    return driver


def _check(result: int, what: str) -> None:
    if result != 0:
        raise EnvironmentBroken(f"{what} failed with CUresult {result}")
