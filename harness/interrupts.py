"""SIGINT and SIGTERM: stop between cases and keep the results, instead of dying mid-write.

A CI runner at its time limit sends SIGTERM, a person presses Ctrl-C; either way the run should stop
drawing cases, finish the case in flight, and still write its summary and page. Python's default
KeyboardInterrupt cannot promise that: it is raised wherever the interpreter happens to be, and was
measured landing in a garbage-collector callback, where it was swallowed and the campaign ran on to
its end. So the handler here only sets a flag, which the campaign reads between cases. A second
signal means "now" for the cases: the handler calls `on_second` (to pass the signal on to child
processes) and exits at once with `ExitCode.INTERRUPTED`. Once the run is writing its report
(`StopRequest.writing`), no signal stops it: a second press a second after the first once threw away
a complete summary, left in a hidden staging folder, because the rename never came.
"""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

from harness.errors import ExitCode

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    """What the handler saw: `requested` after the first signal, its name in `signal_name`."""

    def __init__(self, on_first: Callable[[int], None] = lambda signum: None,
                 on_second: Callable[[int], None] = lambda signum: None):
        self.signal_name: Optional[str] = None
        self._on_first, self._on_second = on_first, on_second
        self._writing = False

    def forward_to(self, forward: Callable[[int], None]) -> None:
        """Pass every signal on (to child processes that lead their own process groups), and the one
        that already came, if one did: it came before there was anyone to pass it to."""
        self._on_first = self._on_second = forward
        if self.requested:
            forward(signal.Signals[self.signal_name])

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def __call__(self) -> Optional[str]:
        """The signal's name once one came, else None: a campaign's `should_stop`."""
        return self.signal_name

    def writing(self) -> None:
        """From here to the end of the block the run writes its report: signals are noted, never acted on."""
        self._writing = True
        if self.requested:
            os.write(2, f"{self.signal_name}: writing the report (a further signal waits for it)\n".encode())

    def handle(self, signum: int, frame) -> None:
        if self._writing:
            os.write(2, f"\n{signal.Signals(signum).name}: the report is being written; exiting when it is\n".encode())
            return
        if self.requested:
            self._on_second(signum)
            os.write(2, f"\n{signal.Signals(signum).name} again: exiting at once\n".encode())
            os._exit(ExitCode.INTERRUPTED)
        self.signal_name = signal.Signals(signum).name
        os.write(2, (f"\n{self.signal_name}: stopping after the case in flight and writing the report "
                     f"(send it again to exit at once)\n").encode())
        self._on_first(signum)


@contextmanager
def stop_on_signals(on_first: Callable[[int], None] = lambda signum: None,
                    on_second: Callable[[int], None] = lambda signum: None) -> Iterator[StopRequest]:
    """Installs the handler for SIGINT and SIGTERM in this block (main thread only), then restores the
    previous handlers. Off the main thread no handler can be installed: the request is never set."""
    request = StopRequest(on_first, on_second)
    if threading.current_thread() is not threading.main_thread():
        yield request
        return
    previous = {s: signal.signal(s, request.handle) for s in STOP_SIGNALS}
    try:
        yield request
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
