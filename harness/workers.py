"""`harness run --workers N|auto`: one campaign process per GPU (per core on the CPU), one report.

With `--gpu-share`, more workers than GPUs share them round robin. A campaign's case is mostly host
work (drawing, the observer, the oracles); one process leaves the GPU idle most of the time, so on
a host with more cores than GPUs several workers per GPU judge more cases. Each worker's forwards
stay on its own streams and its race gates on its own forward stream (a gate runs no kernel: it
takes no GPU time from the others); another process's kernels only add time to a window, never
remove an ordering.

Each worker is `python -m harness run` on its own part of the case stream (`harness.sharding`: the
run's shard, dealt round robin to its workers), pinned to its GPU by `CUDA_VISIBLE_DEVICES` in the
environment it starts with, so CUDA never sees another GPU. GPUs are counted through NVML, which
does not start CUDA in this process. Every worker writes its own folder under `workers/`; this
process then merges them (`reports.merge.merge_summaries`) into the run's `summary.json`, with each
worker's GPU, cases and rate.

Workers lead their own process groups, so a Ctrl-C reaches this process alone; it passes each
signal on, once: the first lets every worker stop after its case in flight and write its summary,
the second ends them at once. A worker still starting (importing torch takes seconds, longer on a
loaded machine) has no handler yet, and the first signal would kill it without a summary: so each
worker says on a pipe when its handler is installed (`announce_ready`), and a first signal that
comes before that is passed on at that moment instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from harness.device import DeviceKind
from harness.errors import EnvironmentBroken, InvalidArgument
from harness.sharding import Shard
from harness.telemetry import NvmlUnavailable, list_gpus, visible_entries

WORKERS_DIR = "workers"
READY_FD = "HARNESS_WORKER_READY_FD"  # the pipe a worker writes one byte to once it handles signals


@dataclass(frozen=True)
class Worker:
    number: int  # 1..count
    shard: Shard  # its part of the whole case stream
    cuda_visible_devices: Optional[str]  # its GPU; None on the CPU
    folder: Path

    @property
    def name(self) -> str:
        return f"w{self.number}"


def cpu_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def visible_gpus() -> list[str]:
    """The CUDA_VISIBLE_DEVICES entries a CUDA run may pin workers to."""
    try:
        return visible_entries(list_gpus())
    except NvmlUnavailable as exc:
        raise EnvironmentBroken(f"--workers on --device cuda needs NVML to count the GPUs: {exc}") from None


def worker_count(spec: str, device: str, gpus: Optional[list[str]] = None, *, share: bool = False,
                 name: str = "spec", share_name: str = "share") -> int:
    """`auto`: one per visible GPU on CUDA, one per core on the CPU; a number is taken as it is, but
    never more than the cores (64 workers on 2 cores once ran a minute without a line of output), and
    on CUDA never more workers than GPUs (each worker has a GPU of its own) unless `share`. `auto`
    with `share`: one worker per two cores (each worker is two processes, itself and the child that
    judges its cases), at least one per GPU. A bad `spec` is refused naming it `name`, and `share`
    `share_name`: the caller's names for them (the command line's flags)."""
    if spec != "auto" and not (spec.isdigit() and int(spec) > 0):
        raise InvalidArgument(f"{name}={spec!r}: auto or a number of workers > 0")
    if spec != "auto" and int(spec) > cpu_cores():
        raise InvalidArgument(f"{name}={spec}: more workers than the {cpu_cores()} core(s) this process may run "
                              "on; each worker is a process judging cases, and more of them than cores only wait "
                              f"for each other: use at most {cpu_cores()}, or auto")
    if not DeviceKind(device).uses_gpus:
        return cpu_cores() if spec == "auto" else int(spec)
    if not gpus:
        raise EnvironmentBroken("--workers on --device cuda: no GPU is visible (CUDA_VISIBLE_DEVICES hides them all, "
                                "or NVML sees none)")
    if spec == "auto":
        count = max(len(gpus), cpu_cores() // 2) if share else len(gpus)
    else:
        count = int(spec)
    if count > len(gpus) and not share:
        raise InvalidArgument(f"{name}={spec}: {len(gpus)} GPU(s) visible ({','.join(gpus)}), one per worker; "
                              f"use {name} {len(gpus)} or auto, or {share_name} to let workers share GPUs")
    return count


def plan(count: int, shard: Shard, folder: Path, gpus: Optional[list[str]]) -> list[Worker]:
    """Worker n on part n of `count` of the shard, on GPU n (round robin when workers share GPUs)."""
    return [Worker(n, shard.split(count, n), gpus[(n - 1) % len(gpus)] if gpus else None,
                   Path(folder) / WORKERS_DIR / f"w{n}")
            for n in range(1, count + 1)]


def _forward_lines(prefix: str, pipe, out) -> None:
    for line in iter(pipe.readline, ""):
        out.write(f"{prefix} {line}")
        out.flush()
    pipe.close()


def announce_ready() -> None:
    """In a worker, once its signal handler is installed: tells the process that started it (which
    holds back a first signal until then). Nothing to do in a run that is not a worker."""
    fd = os.environ.pop(READY_FD, None)
    if fd is not None:
        os.write(int(fd), b"r")
        os.close(int(fd))


class WorkerProcesses:
    """The running workers: `start()`, `signal(signum)` to pass a stop on, `wait()` for their codes.
    Each worker's stdout goes to `output.log` in its folder; its stderr (progress lines, errors) is
    passed on here, each line prefixed with the worker's name."""

    def __init__(self, workers: list[Worker], run_args: list[str]):
        self.workers, self.run_args = workers, run_args
        self.procs: list[subprocess.Popen] = []
        self._threads: list[threading.Thread] = []
        self.started = 0.0
        self._lock = threading.Lock()  # orders a signal against a worker's becoming ready
        self._ready: set[int] = set()  # indices into procs of the workers that handle signals
        self._stop: Optional[int] = None  # the first signal, held for the workers not yet ready

    def command(self, worker: Worker) -> list[str]:
        return [sys.executable, "-m", "harness", "run", *self.run_args, "--shard", str(worker.shard),
                "--report-dir", str(worker.folder)]

    def start(self) -> None:
        self.started = time.perf_counter()
        for worker in self.workers:
            worker.folder.mkdir(parents=True, exist_ok=True)
            env = dict(os.environ)
            if worker.cuda_visible_devices is not None:
                env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA's indices are then NVML's
                env["CUDA_VISIBLE_DEVICES"] = worker.cuda_visible_devices
            ready_read, ready_write = os.pipe()
            env[READY_FD] = str(ready_write)
            with open(worker.folder / "output.log", "w") as log:
                proc = subprocess.Popen(self.command(worker), stdout=log, stderr=subprocess.PIPE, text=True, env=env,
                                        start_new_session=True, pass_fds=(ready_write,))
            os.close(ready_write)
            with self._lock:
                self.procs.append(proc)
            index = len(self.procs) - 1
            for thread in (threading.Thread(target=_forward_lines, args=(f"[{worker.name}]", proc.stderr, sys.stderr),
                                            daemon=True),
                           threading.Thread(target=self._await_ready, args=(index, ready_read), daemon=True)):
                thread.start()
                self._threads.append(thread)

    def _await_ready(self, index: int, ready_read: int) -> None:
        """Marks worker `index` ready when it says so, and passes on a first signal held for it.
        A worker that exits before it is ready closes the pipe with nothing written."""
        with os.fdopen(ready_read, "rb") as pipe:
            if not pipe.read(1):
                return
        with self._lock:
            self._ready.add(index)
            if self._stop is not None:
                self._send(self.procs[index], self._stop)

    @staticmethod
    def _send(proc: subprocess.Popen, signum: int) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)

    def signal(self, signum: int) -> None:
        """The first signal goes to the workers that handle signals now, and to each other one as it
        becomes ready (also to one started after it); a later signal goes to every worker at once, to
        end them, ready or not."""
        with self._lock:
            if self._stop is None:
                self._stop = signum
                for index in self._ready:
                    self._send(self.procs[index], signum)
            else:
                for proc in self.procs:
                    self._send(proc, signum)

    def wait(self) -> tuple[list[int], float]:
        """The workers' exit codes, and the seconds from the first start to the last exit."""
        codes = [proc.wait() for proc in self.procs]
        for thread in self._threads:
            thread.join(timeout=5)
        return codes, time.perf_counter() - self.started
