"""The CUDA device: real streams lose a real race when the event comes before the read."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu


def program(*, event_after_read: bool) -> tuple[int, int]:
    from harness.device import make_device

    device = make_device("cuda")
    table = torch.ones(1 << 20, device="cuda")
    seen = torch.zeros_like(table)
    torch.cuda.synchronize()  # filled on torch's default stream, which the device's streams do not wait for
    with device.stream(device.forward_stream):
        if event_after_read:
            device.launch("snapshot", lambda: seen.copy_(table), reads={"table": None}, writes={"seen": None})
            event = device.record_event()
            device.delay(50_000_000)
        else:
            event = device.record_event()
            device.delay(50_000_000)
            device.launch("late_read", lambda: seen.copy_(table), reads={"table": None}, writes={"seen": None})
    device.wait_event(device.schedule_stream, event)
    with device.stream(device.schedule_stream):
        device.launch("mutate", lambda: table.zero_(), writes={"table": None})
    device.synchronize()
    return int(seen.sum().item()), len(device.tracker.conflicts)


def test_late_read_after_the_event_loses_the_race_and_the_tracker_says_so():
    corrupted, conflicts = program(event_after_read=False)
    assert corrupted < (1 << 20) and conflicts == 1


def test_snapshot_before_the_event_is_safe():
    value, conflicts = program(event_after_read=True)
    assert value == 1 << 20 and conflicts == 0


def test_reference_case_runs_on_cuda_and_matches_float64():
    from harness.case import Batch, Case, Mutation, Request
    from harness.engine import run_case
    from harness.targets import ReferenceTarget

    case = Case(delay_cycles=20_000_000, batches=(Batch(requests=(Request(140, 9), Request(3, 6)),
                                                        mutations=(Mutation("swa_clear", count=4),)),))
    assert not run_case(ReferenceTarget(), case, "cuda").findings


def overlap_ms(case, target) -> float:
    from harness.engine import execute

    run = execute(target, case, "cuda")
    assert run.crash is None and len(run.overlap_ms) == 1
    return run.overlap_ms[0]


def test_the_scheduler_starts_before_the_forward_ends_only_where_read_done_lets_it():
    """`RunRecord.overlap_ms` in time, on a real GPU: the race gate holds the forward stream right after the
    read-done event until the scheduler's work has run or waits for it, so a scheduler that waits on the event
    starts well before the forward ends, and one that waits on the whole forward (or gets no event) after it."""
    from harness.case import Batch, Case, Flags, Mutation, Request
    from harness.mutants.corpus import mutant_target
    from harness.targets import ReferenceTarget

    published = Case(delay_cycles=20_000_000, batches=(Batch(requests=(Request(140, 9), Request(3, 6)),
                                                             mutations=(Mutation("req_to_token_rewrite", count=2),)),))
    unpublished = Case(**{**published.__dict__, "flags": Flags(SGLANG_ENABLE_PREFILL_WAR_READ_DONE=False)})
    # the best of three: where other processes share the GPU, a time slice can land between the gate and the event
    assert max(overlap_ms(published, ReferenceTarget()) for _ in range(3)) > 0.0
    assert overlap_ms(published, mutant_target("barrier_waits_forward_after_publish")) <= 0.05
    assert overlap_ms(unpublished, ReferenceTarget()) <= 0.05
