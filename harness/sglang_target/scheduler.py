"""SGLang's own scheduler loop around one batch: `Scheduler.run_event_loop` and `event_loop_overlap`.

The real code runs on `SchedulerShell`, an object with the attributes those two methods read; what a
real Scheduler would do around them is the harness's:

- `run_event_loop` computes the WAR barrier's enabling (`_war_barrier_enabled = is_cuda() or
  SGLANG_ENABLE_WAR_BARRIER`, its own expression), enters the schedule stream's context and dispatches to
  the overlap loop (`dispatch_event_loop`). The host is modelled as a CUDA host through the functions that
  expression calls: on the CPU simulator `is_cuda` answers True while the real code runs, so a barrier
  that a platform check turns off (SGLang #36054 / #38258) is off here too;
- `event_loop_overlap`, two iterations: the first runs the batch (`run_batch`: the session's forward on
  the forward stream, then the harness's `after_launch`) and SGLang applies `_apply_war_barrier` where its
  loop does; the second has no batch and processes the first one's result (`pop_and_process`): the
  harness's mutator, on the schedule stream the loop runs on. Then `gracefully_exit` ends the loop.

Replaced: request intake (`ingest_requests`; before 0.5.21 `request_receiver` and `process_input_requests`),
the chunked-request stash's device work in the next scheduling step (the LMCache store, see the session), batch selection (`get_next_batch_to_run` returns the case's
batch), the batch object (`ShellBatch`: the fields the loop reads), result processing (the mutator),
sampling and idle checks (no-ops).
"""

from __future__ import annotations

import contextlib
from types import MethodType, SimpleNamespace
from typing import Any, Callable, Iterator, Optional


class ShellBatch:
    """The ScheduleBatch fields the overlap loop reads (`is_disable_overlap_for_batch`, `copy`)."""

    def __init__(self, forward_mode, spec_algorithm, fb):
        self.forward_mode, self.spec_algorithm, self.fb = forward_mode, spec_algorithm, fb
        self.is_extend_in_batch = forward_mode.is_extend()

    def grammar_needs_sync(self) -> bool:
        return False

    def copy(self) -> "ShellBatch":
        return ShellBatch(self.forward_mode, self.spec_algorithm, self.fb)


class SchedulerShell:
    """The attributes of a Scheduler that `run_event_loop` and `event_loop_overlap` read."""

    def __init__(self, api, *, device_module, schedule_stream, forward_stream, model_worker, harness_device,
                 harness_stream: Callable[[], Any], models_cuda: bool):
        sched = api.mods["scheduler"]
        self.api, self.models_cuda = api, models_cuda
        self.harness_device, self.harness_stream = harness_device, harness_stream
        self.device = "cuda"  # the host modelled: SGLang on a CUDA server
        self.device_module = device_module
        self.schedule_stream, self.forward_stream = schedule_stream, forward_stream
        self.model_worker = model_worker
        self.enable_overlap, self.enable_overlap_mlx, self.enable_pdmux = True, False, False
        self.enable_unified_memory, self.require_mlp_sync, self.is_generation = False, False, True
        self.disaggregation_mode = sched.DisaggregationMode.NULL
        self.server_args = SimpleNamespace(enable_pd_role_switch=False)
        self.metrics_reporter = SimpleNamespace(start_scheduler_time_accounting=lambda: None)
        self.running_batch = self.last_batch = self.cur_batch_for_debug = None
        self._engine_paused = False
        self._iterations = 0
        self._plan: Optional[tuple[ShellBatch, Callable[[], Any], Callable[[], None]]] = None
        self._process: Callable[[], None] = lambda: None
        self._stash: Callable[[], Any] = lambda: None
        self.outputs: Any = None
        self.loops_dispatched = 0
        self.request_receiver = SimpleNamespace(recv_requests=self._receive)  # the intake before 0.5.21
        for name in ("run_event_loop", "_apply_war_barrier", "is_disable_overlap_for_batch"):
            setattr(self, name, MethodType(getattr(sched.Scheduler, name), self))
        self._real_overlap_loop = MethodType(sched.Scheduler.event_loop_overlap, self)

    # -- what the real loop calls on its scheduler ------------------------------------------------

    @property
    def gracefully_exit(self) -> bool:
        return self._iterations >= 2

    def ingest_requests(self) -> None:
        self._iterations += 1

    def _receive(self) -> list:
        """`request_receiver.recv_requests()`, the loop's intake before 0.5.21: one iteration, no request."""
        self.ingest_requests()
        return []

    def process_input_requests(self, recv_reqs) -> None:
        """The intake's second half before 0.5.21: nothing arrived."""

    def get_next_batch_to_run(self, *, running_batch, last_batch):
        """The batch on the first iteration. On the second, the scheduling step after the batch ran (past the
        barrier, before its result is processed), where SGLang stashes a chunked request: `stash` does what
        the stash issues on the device (the LMCache store of the chunk, see the session)."""
        batch = self._plan[0] if self._iterations == 1 else None
        if self._iterations == 2:
            with self.harness_device.stream(self.harness_stream()):
                stored = self._stash()
            if stored is not None and isinstance(self.outputs, dict):
                self.outputs.update(stored)
        return SimpleNamespace(running_batch=running_batch, batch_to_run=batch)

    def run_batch(self, batch: ShellBatch):
        _, forward, after_launch = self._plan
        self.outputs = forward()
        after_launch()
        return self.outputs

    def process_batch_result(self, batch: ShellBatch, result) -> None:
        """The harness's mutator, on the stream SGLang's loop is on (its stream context's)."""
        device = self.harness_device
        with device.stream(self.harness_stream()):
            self._process()

    def launch_batch_sample_if_needed(self, batch_result, batch) -> None:
        """Sampling reads the logits only: nothing of the shared tables."""

    def on_idle(self) -> None:
        """The idle self-check: nothing to check in one batch."""

    # -- the harness's side -----------------------------------------------------------------------

    def event_loop_overlap(self) -> None:
        """What `dispatch_event_loop` calls for an overlap scheduler: SGLang's own loop, counted."""
        self.loops_dispatched += 1
        self._real_overlap_loop()

    @contextlib.contextmanager
    def _cuda_host(self) -> Iterator[None]:
        """`is_cuda()` answers as on a CUDA server while SGLang's loop runs (the CPU simulator's host)."""
        sched = self.api.mods["scheduler"]
        if self.models_cuda:
            yield
            return
        saved = sched.is_cuda
        sched.is_cuda = lambda: True
        try:
            yield
        finally:
            sched.is_cuda = saved

    def iterate(self, batch: ShellBatch, *, forward: Callable[[], Any], process: Callable[[], None],
                after_launch: Callable[[], None], stash: Callable[[], Any] = lambda: None):
        """One batch through SGLang's `run_event_loop` and `event_loop_overlap`; the forward's outputs (and
        what `stash` returns: outputs of the next step's device work on the batch)."""
        self._plan, self._process, self._stash = (batch, forward, after_launch), process, stash
        self._iterations, self.last_batch, self.running_batch, self.outputs = 0, None, None, None
        before = self.loops_dispatched
        with self._cuda_host():
            self.run_event_loop()
        if self.loops_dispatched != before + 1:
            raise RuntimeError("SGLang's run_event_loop did not dispatch to event_loop_overlap for an overlap "
                               "scheduler: the batch never ran")
        return self.outputs
