"""The scheduler's side of SGLang's overlap loop: launch, WAR barrier, result processing."""

from __future__ import annotations

from typing import Callable


class Scheduler:
    """`event_loop_overlap`, one iteration: run_batch, then at once `_apply_war_barrier`, then the
    schedule stream's work (result processing, allocation, frees; HiCache backup)."""

    def __init__(self, device, model_runner, flags):
        self.device, self.model_runner, self.flags = device, model_runner, flags

    @property
    def last_shared_read_runner(self):
        """The base spec worker's choice, the target runner (EAGLE v2 would return its draft runner)."""
        return self.model_runner

    def _apply_war_barrier(self) -> None:
        runner = self.last_shared_read_runner
        event, runner.shared_read_done_event = runner.shared_read_done_event, None
        dev = self.device
        if event is not None and not self.flags.SGLANG_FORCE_COARSE_WAR_BARRIER:
            dev.wait_event(dev.schedule_stream, event)
        else:
            dev.wait_stream(dev.schedule_stream, dev.forward_stream)

    def event_loop_step(self, fb, *, graph: bool, process_batch_result: Callable[[], None],
                        after_launch: Callable[[], None] = lambda: None) -> dict:
        dev = self.device
        with dev.stream(dev.forward_stream):
            outputs = self.model_runner.forward(fb, graph=graph)
        after_launch()
        self._apply_war_barrier()
        with dev.stream(dev.schedule_stream):
            process_batch_result()
            if self.flags.offloads_kv():
                outputs["host_kv"] = self._backup_kv()
        return outputs

    def _backup_kv(self):
        """HiCache / storage / LMCache: a copy of the KV pool ordered only behind the schedule stream."""
        pool = self.model_runner.token_to_kv_pool
        host = pool.swa_kv.clone()
        self.device.launch("hicache.backup", lambda: host.copy_(pool.swa_kv),
                           reads={f"swa_kv[{i}]": None for i in range(pool.swa_kv.shape[0])},
                           writes={"host_kv": None})
        return host
