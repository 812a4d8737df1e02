"""What a campaign prints while it runs, so that a long one is never an hour of silence.

On a terminal: a rich progress bar. Off a terminal (a CI log): one plain line every `every_s`
seconds, with the cases so far, the rate, the time left at that rate and the findings so far. `-v`
adds a line per case; `-q` prints nothing until the end. The lines go to stderr, the results to
stdout.
"""

from __future__ import annotations

import sys
import time
from typing import Optional, TextIO

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

QUIET, NORMAL, VERBOSE = -1, 0, 1
PROGRESS_EVERY_S = 10.0


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


class CampaignProgress:
    """`update(result)` after each judged case (a `CampaignResult`); use as a context manager."""

    def __init__(self, total: int, *, verbosity: int = NORMAL, every_s: float = PROGRESS_EVERY_S,
                 label: str = "campaign", stream: Optional[TextIO] = None):
        self.total, self.verbosity, self.every_s, self.label = total, verbosity, every_s, label
        self.stream = stream or sys.stderr
        self._started = time.monotonic()
        self._last_line = self._started
        self._bar: Optional[Progress] = None
        if verbosity == NORMAL and self.stream.isatty():
            self._bar = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), transient=True)
            self._task = self._bar.add_task(label, total=total)

    def __enter__(self) -> "CampaignProgress":
        if self._bar:
            self._bar.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._bar:
            self._bar.stop()

    def line(self, result) -> str:
        """The plain progress line: cases, rate, ETA, distinct failures so far (the count the run ends with)."""
        elapsed = time.monotonic() - self._started
        rate = result.cases / elapsed if elapsed > 0 else 0.0
        left = max(0, self.total - result.cases)
        eta = _duration(left / rate) if rate > 0 else "unknown"
        return (f"{self.label}: {result.cases}/{self.total} cases, {rate:.2f} cases/s, ETA {eta}, "
                f"{len(result.failure_signatures)} failure(s) so far")

    def update(self, result) -> None:
        if self.verbosity == QUIET:
            return
        if self._bar:
            self._bar.update(self._task, completed=result.cases)
            return
        if self.verbosity == VERBOSE and result.cases_log:
            record = result.cases_log[-1]
            print(f"{self.label}: case {record['i']} {record['outcome']}: {record['spec']}, {record['requests']} "
                  f"request(s), {record['tokens']} token(s), {'graph' if record['graph'] else 'eager'}",
                  file=self.stream, flush=True)
        now = time.monotonic()
        if now - self._last_line >= self.every_s:
            self._last_line = now
            print(self.line(result), file=self.stream, flush=True)
