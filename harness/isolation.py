"""Cases judged in a child process, so that one which kills its process or hangs does not end the run.

A case that makes an illegal memory access leaves the CUDA context unusable, a segfault in an
extension kills the interpreter, and a deadlocked stream never returns. `IsolatedRunner` keeps one
child (``python -m harness.isolation``: a fresh interpreter, so never a fork of a process that has
initialised CUDA) and sends it cases one at a time over its stdin; the child answers each with the
judged findings and the replay command as one JSON line. A child that dies, or does not answer within
the case's timeout (it is then killed), becomes an ``execution`` finding of kind ``crash`` or ``hang``
with the exit status and the tail of its stderr, and the next case gets a new child. On CUDA the
child also checks that the context survived each case, and is replaced when it did not.

`IsolatedPool` keeps several such children and judges up to that many cases at once (`harness run
--jobs N`): a case is mostly host work in its child, so one campaign process, drawing the cases once,
keeps several children and the GPU they share busy.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import json
import os
import queue
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, TypeVar

from harness.case import Case
from harness.device import context_error
from harness.engine import Finding, replay_command, run_case
from harness.errors import EnvironmentBroken, HarnessError, InvalidArgument
from harness.overlap import BatchOverlap
from harness.targets import REFERENCE, TargetSpec
from harness.validation import check_positive

CASE_TIMEOUT_S = 300.0
# A case past its timeout is a hang only if a second run with this many times the time does not finish either: a
# slow case (an interpreted forward of 12,000 tokens beside another job on two cores took 163 s against 120 s, and
# was reported hung) is judged, not reported.
HANG_CONFIRM_FACTOR = 4
STARTUP_TIMEOUT_S = 300.0  # importing torch on a loaded machine is slow
STDERR_TAIL_CHARS = 2000
T = TypeVar("T")  # what work handed to a free runner of a pool returns
_ERRORS = {"InvalidArgument": InvalidArgument, "EnvironmentBroken": EnvironmentBroken}


@dataclass
class IsolatedResult:
    """What `engine.CaseResult` gives the campaign (case, findings, replay), judged in a child."""

    case: Case
    findings: list[Finding]
    replay: str
    seconds: float
    outcome: str = "judged"  # or "crash", "hang"
    case_phases: dict = dataclasses.field(default_factory=dict)  # the child's CaseResult.phases()
    openings: list = dataclasses.field(default_factory=list)  # the child's CaseResult.gate_openings()
    overlaps: list[BatchOverlap] = dataclasses.field(default_factory=list)  # the child's CaseResult.batch_overlaps()

    def phases(self) -> dict[str, float]:
        """The child's phases, and `isolation`: the rest of the round trip (the request, the answer, a
        new child's start-up)."""
        return {**self.case_phases, "isolation": max(0.0, self.seconds - sum(self.case_phases.values()))}

    def gate_openings(self) -> list[str]:
        return list(self.openings)

    def batch_overlaps(self) -> list[BatchOverlap]:
        return list(self.overlaps)


class _Timeout(Exception):
    pass


class IsolatedRunner:
    """One child process at a time, reused across cases until one kills it.

    ``with IsolatedRunner(timeout_s=60) as runner: result = runner.run_case(case, "cuda", ...)``
    """

    def __init__(self, *, timeout_s: float = CASE_TIMEOUT_S, startup_timeout_s: float = STARTUP_TIMEOUT_S):
        if not timeout_s > 0:
            raise InvalidArgument(f"timeout_s={timeout_s!r}: must be > 0 seconds")
        self.timeout_s, self.startup_timeout_s = timeout_s, startup_timeout_s
        self._proc: subprocess.Popen | None = None
        self._stderr = None
        self._buffer = b""

    def run_case(self, case: Case, device_name: str = "cpu", *, schedule: str = "adversarial",
                 target_spec: TargetSpec = REFERENCE, oracles: frozenset | None = None,
                 timeout_s: float | None = None, confirmed: bool = False) -> IsolatedResult:
        """`engine.run_case` in the child; the target is rebuilt there from `target_spec`.
        `timeout_s` overrides the runner's per-case timeout for this case. A case past its timeout runs once more,
        in a new child, with `HANG_CONFIRM_FACTOR` times the time (`confirmed`: this is that run): only a case that
        does not finish then either is a hang; one that does is judged as it ran."""
        case.validate()
        request = {"case": case.to_json(), "device": device_name, "schedule": schedule,
                   "target_spec": target_spec.to_dict(), "oracles": sorted(oracles) if oracles is not None else None}
        replay = replay_command(case, target_spec=target_spec, device=device_name, schedule=schedule, oracles=oracles)
        started, timeout_s = time.perf_counter(), timeout_s or self.timeout_s
        self.start()
        proc, mark = self._proc, self._stderr.seek(0, os.SEEK_END)
        try:
            proc.stdin.write((json.dumps(request) + "\n").encode())
            proc.stdin.flush()
            line = self._read_line(timeout_s)
        except _Timeout:
            self._kill()
            if not confirmed:  # slow is not hung: a case of many tokens, interpreted, beside other jobs
                again = self.run_case(case, device_name, schedule=schedule, target_spec=target_spec, oracles=oracles,
                                      timeout_s=timeout_s * HANG_CONFIRM_FACTOR, confirmed=True)
                return dataclasses.replace(again, seconds=time.perf_counter() - started)
            message = (f"the case did not finish within {timeout_s / HANG_CONFIRM_FACTOR:g}s, nor within "
                       f"{timeout_s:g}s on a second run; its process was killed")
            return self._failed(case, replay, started, "hang", message, mark, {"timeout_s": timeout_s})
        except (BrokenPipeError, EOFError):
            line = None
        if line is None:  # the child died with the case
            returncode = self._reap()
            return self._failed(case, replay, started, "crash", f"the case's process {_exit_status(returncode)}",
                                mark, {"returncode": returncode})
        answer = json.loads(line)
        if "error" in answer:  # the harness refused the request: bad input or a broken environment
            raise _ERRORS.get(answer["error"]["type"], HarnessError)(answer["error"]["message"])
        findings = [Finding(**f) for f in answer["findings"]]
        if answer.get("context_error"):  # the child exits after answering
            self._reap()
            findings = with_context_loss(findings, answer["context_error"])
        return IsolatedResult(case, findings, answer["replay"], time.perf_counter() - started,
                              "crash" if answer.get("context_error") else "judged", answer["phases"],
                              answer["gate_openings"], [BatchOverlap(**batch) for batch in answer["batch_overlaps"]])

    def end_input(self) -> None:
        """Tells the child there is no further case: its loop ends and it exits, in its own time."""
        if self._proc is not None and not self._proc.stdin.closed:
            self._proc.stdin.close()

    def close(self) -> None:
        if self._proc is not None:
            self.end_input()
            self._reap()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the child ----------------------------------------------------------------------------------

    def start(self) -> None:
        """Starts the child unless it runs (`run_case` does this itself; a pool starts its children
        at once, so that they import torch side by side while this process draws its first cases)."""
        if self._proc is not None and self._proc.poll() is None:
            return
        if self._stderr is None:
            # Appending: the child never writes over what this process reads. Closed in close().
            self._stderr = tempfile.TemporaryFile("a+b")  # noqa: SIM115
        env = dict(os.environ)
        # The child imports what this process can (a `module:factory` target from a test folder).
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self._proc = subprocess.Popen([sys.executable, "-m", "harness.isolation"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=self._stderr, env=env, start_new_session=True)
        self._buffer = b""
        mark = self._stderr.seek(0, os.SEEK_END)
        try:
            line = self._read_line(self.startup_timeout_s)
        except _Timeout:
            line = None
        if line is None or not json.loads(line).get("ready"):
            self._kill()
            raise EnvironmentBroken(f"the isolated case runner did not start: {self._tail(mark) or 'no output'}")

    def _read_line(self, timeout: float) -> bytes | None:
        """One line from the child; None when it closed its output (died); _Timeout after `timeout`."""
        deadline = time.monotonic() + timeout
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise _Timeout
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _reap(self) -> int:
        """The exit status of a child that is ending on its own (killed if it does not within 10 s)."""
        try:
            returncode = self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            returncode = self._kill()
        self._proc = None
        return returncode

    def _kill(self) -> int:
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)  # the child leads its own session: its helpers die too
        except ProcessLookupError:
            pass
        returncode = self._proc.wait()
        self._proc = None
        return returncode

    def _tail(self, mark: int) -> str:
        self._stderr.seek(max(mark, self._stderr.seek(0, os.SEEK_END) - STDERR_TAIL_CHARS))
        return self._stderr.read().decode(errors="replace").strip()

    def _failed(self, case, replay, started, kind, message, mark, details) -> IsolatedResult:
        tail = self._tail(mark)
        error = _error_line(tail)
        if error:  # the cause first: a one-line excerpt of the finding (a table, a summary) shows it
            message, details = f"{message}: {error}", {**details, "error": error}
        finding = _crash_finding(kind, f"{message}; stderr tail:\n{tail}" if tail else f"{message}; no stderr output",
                                 {**details, "stderr_tail": tail})
        return IsolatedResult(case, [finding], replay, time.perf_counter() - started, kind)


class IsolatedPool:
    """`size` isolated children (each an `IsolatedRunner`, all started at once), judging up to
    `size` cases at once.

    ``submit(case, device_name, ...)`` hands a case to the next free child and returns a `Future` of
    its `IsolatedResult`; ``run_case`` is the same, waited for. A thread per child waits for its
    answer, so this process goes on drawing cases meanwhile. A child's crash or hang is that case's
    finding, as with one runner; an error of the harness itself (bad input, a child that cannot
    start) is the future's exception.

    ``with IsolatedPool(4, timeout_s=120) as pool: futures = [pool.submit(c, "cuda") for c in cases]``
    """

    def __init__(self, size: int, *, timeout_s: float = CASE_TIMEOUT_S,
                 startup_timeout_s: float = STARTUP_TIMEOUT_S):
        check_positive(size, "size")
        self.size = size
        self._free: queue.SimpleQueue[IsolatedRunner] = queue.SimpleQueue()
        for _ in range(size):
            self._free.put(IsolatedRunner(timeout_s=timeout_s, startup_timeout_s=startup_timeout_s))
        self._threads = ThreadPoolExecutor(max_workers=size, thread_name_prefix="isolated-case")
        for _ in range(size):  # a child that cannot start fails its first case, loudly
            self._threads.submit(self._on_free_runner, IsolatedRunner.start)

    def submit(self, case: Case, device_name: str = "cpu", **options) -> Future:
        """A future of `IsolatedRunner.run_case(case, device_name, **options)` in a free child."""
        return self._threads.submit(self._on_free_runner, lambda runner: runner.run_case(case, device_name, **options))

    def run_case(self, case: Case, device_name: str = "cpu", **options) -> IsolatedResult:
        return self.submit(case, device_name, **options).result()

    def _on_free_runner(self, work: Callable[[IsolatedRunner], T]) -> T:
        runner = self._free.get()  # never waits: the pool has as many runners as threads
        try:
            return work(runner)
        finally:
            self._free.put(runner)

    def close(self) -> None:
        """Waits for the cases being judged, then ends every child: all are told at once, so that
        they exit side by side."""
        self._threads.shutdown(wait=True, cancel_futures=True)
        runners = [self._free.get() for _ in range(self.size)]
        for runner in runners:
            runner.end_input()
        for runner in runners:
            runner.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_ERROR_LINE = re.compile(r"^(Fatal Python error: .+|([A-Za-z_][\w.]*)?(Error|Exception|Interrupt)(: .*)?)$")


def _error_line(tail: str) -> str | None:
    """The last line of a stderr tail that names an error (`RuntimeError: ...`, `Fatal Python error: ...`),
    or None: the traceback's frames come before it, and CUDA's notes often after it."""
    errors = [line.strip() for line in tail.splitlines() if _ERROR_LINE.match(line.strip())]
    return errors[-1] if errors else None


def _crash_finding(kind: str, message: str, details: dict) -> Finding:
    return Finding("execution", kind, message, details=details)


def with_context_loss(findings: list[Finding], error: str) -> list[Finding]:
    """The case's findings once its process's CUDA context is lost: a crash finding saying so, unless the engine's
    `execution/context-lost` already names the crash that lost it (one cause, one finding)."""
    if any((f.oracle, f.kind) == ("execution", "context-lost") for f in findings):
        return findings
    return findings + [_crash_finding("crash", f"the case left the CUDA context unusable: {error}",
                                      {"context_error": error})]


def _exit_status(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "an unknown signal"
        return f"died of {name} (signal {-returncode})"
    return f"exited with status {returncode}" + (" without answering" if returncode == 0 else "")


def _serve(request: dict) -> dict:
    try:
        target_spec = TargetSpec.from_dict(request["target_spec"])
        oracles = frozenset(request["oracles"]) if request["oracles"] is not None else None
        result = run_case(target_spec.load(), Case.from_json(request["case"]), request["device"],
                          schedule=request["schedule"], target_spec=target_spec, oracles=oracles)
    except HarnessError as exc:
        kind = next(c.__name__ for c in type(exc).__mro__ if c.__name__ in _ERRORS or c is HarnessError)
        return {"error": {"type": kind, "message": str(exc)}}
    answer = {"findings": [dataclasses.asdict(f) for f in result.findings], "replay": result.replay,
              "phases": result.phases(), "gate_openings": result.gate_openings(),
              "batch_overlaps": [dataclasses.asdict(batch) for batch in result.batch_overlaps()]}
    lost = context_error(request["device"])
    if lost:  # a sticky CUDA error: every later case in this process would fail
        answer["context_error"] = lost
    return answer


def _exit_with_parent() -> None:
    """The child leads its own session, so a parent killed hard does not take it along: it follows."""
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def main() -> None:
    """The child: one JSON request per stdin line, one JSON answer per line on the original stdout."""
    threading.Thread(target=_exit_with_parent, daemon=True).start()
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever the target prints goes to stderr, never into the answers
    faulthandler.enable()  # a segfault leaves a Python traceback in the stderr tail
    answers.write(json.dumps({"ready": os.getpid()}) + "\n")
    for line in sys.stdin:
        answer = _serve(json.loads(line))
        answers.write(json.dumps(answer, default=repr) + "\n")
        if answer.get("context_error"):
            return


if __name__ == "__main__":
    main()
