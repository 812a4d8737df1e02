"""The fast-path oracle on `--target sglang`: SGLang's own events and barrier reach the tracker's timeline, a
clean publishing batch keeps its fast path, and SGLang's `_apply_war_barrier` made to wait on the whole forward
stream after a publish is a `missed-fast-path`.

Needs sglang 0.5.23 (skipped without it), as tests/test_sglang_target.py.
"""

from __future__ import annotations

import dataclasses

from harness.sglang_target.api import prepare_triton

prepare_triton()

import pytest

pytest.importorskip("sglang", reason="the sglang package is not installed: --target sglang needs "
                                     "`pip install --no-deps sglang==0.5.23` plus its CPU import deps")

from harness.case import Batch, Case, Dims, Flags, Mutation, Request
from harness.engine import run_case
from harness.hb import Checkpoint, Recorded
from harness.sglang_target.api import load_api
from harness.sglang_target.real_backend import fixed_dims
from harness.targets import TargetSpec
from harness.targets.protocol import Publish, first

SGLANG = TargetSpec("sglang")
CASE = Case(dims=dataclasses.replace(Dims(), **fixed_dims(load_api())),
            flags=Flags(SGLANG_ENABLE_PREFILL_WAR_READ_DONE=True),
            batches=(Batch(requests=(Request(5, 3), Request(0, 2)), mutations=(Mutation("req_to_token_rewrite"),)),))


@pytest.fixture(scope="module")
def target():
    from harness.sglang_target import SglangTarget

    return SglangTarget()


def test_sglang_s_event_and_barrier_are_on_the_timeline_and_keep_the_fast_path(target):
    result = run_case(target, CASE, target_spec=SGLANG)
    publish, timeline = first(result.overlapped.notes[0], Publish), result.overlapped.timeline[0]
    record = next(e for e in timeline if isinstance(e, Recorded) and e.event == publish.event)
    scheduler = next(e for e in timeline if isinstance(e, Checkpoint))
    forward = result.overlapped.forward_stream
    assert scheduler.clock[forward] == record.clock[forward]  # it waited on the event, and on nothing later
    assert result.findings == []


def test_a_barrier_that_waits_on_the_forward_stream_after_a_publish_is_a_missed_fast_path(target, monkeypatch):
    scheduler = load_api().mods["scheduler"].Scheduler
    barrier = scheduler._apply_war_barrier

    def waits_past_the_event(self):
        barrier(self)
        self.schedule_stream.wait_stream(self.forward_stream)

    monkeypatch.setattr(scheduler, "_apply_war_barrier", waits_past_the_event)
    findings = run_case(target, CASE, target_spec=SGLANG, oracles=frozenset({"fast-path"})).findings
    assert [(f.kind, f.details["cause"]) for f in findings] == [("missed-fast-path", "barrier-waits-past-event")]
