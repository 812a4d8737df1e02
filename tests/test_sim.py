"""The CPU stream simulator: policies, exact replay, and exhaustive exploration."""

from __future__ import annotations

import pytest
import torch

from harness.case import Batch, Case, Mutation, Request
from harness.device import SimDevice
from harness.engine import execute, explore, run_case
from harness.errors import InvalidArgument
from harness.mutants.corpus import mutant_target
from harness.targets import ReferenceTarget, TargetSpec


def two_stream_program(device: SimDevice, *, with_event: bool) -> torch.Tensor:
    table = torch.tensor([1])
    seen = torch.tensor([0])
    with device.stream(device.forward_stream):
        device.launch("read", lambda: None)
        event = device.record_event()
        device.launch("late_read", lambda: seen.copy_(table))
    if with_event:
        device.wait_event(device.schedule_stream, event)
    else:
        device.wait_stream(device.schedule_stream, device.forward_stream)
    with device.stream(device.schedule_stream):
        device.launch("mutate", lambda: table.fill_(9))
    device.synchronize()
    return seen


def test_adversarial_runs_the_scheduler_as_early_as_allowed():
    assert two_stream_program(SimDevice("adversarial"), with_event=True).item() == 9
    assert two_stream_program(SimDevice("adversarial"), with_event=False).item() == 1


def test_forced_schedule_replays_exactly():
    first = SimDevice("random:3")
    two_stream_program(first, with_event=True)
    again = SimDevice(f"forced:{first.forced_string()}")
    two_stream_program(again, with_event=True)
    assert again.trace() == first.trace()


def test_wait_on_an_unrecorded_event_is_a_no_op():
    device = SimDevice()
    from harness.device.base import Event

    device.wait_event(device.schedule_stream, Event(99))
    device.synchronize()
    assert device.trace() == []


@pytest.mark.parametrize("bad", ["sometimes", "random:x", "forced:FXS"])
def test_bad_schedule_names_the_allowed_values(bad):
    with pytest.raises(InvalidArgument, match="adversarial"):
        SimDevice(bad)


def test_random_schedules_differ_and_are_seeded():
    traces = set()
    for seed in range(8):
        d = SimDevice(f"random:{seed}")
        two_stream_program(d, with_event=True)
        traces.add(tuple(d.trace()))
    assert len(traces) > 1


CASE = Case(batches=(Batch(requests=(Request(2, 2),), mutations=(Mutation("req_to_token_rewrite"),)),),)


def test_exploration_counts_every_order_and_finds_the_racy_ones():
    clean = explore(ReferenceTarget(), CASE, bound=1000)
    assert clean.explored > 1 and not clean.truncated and not clean.failing
    racy = explore(mutant_target("snapshot_skipped"), CASE, bound=1000, oracles=frozenset({"differential"}))
    assert 0 < len(racy.failing) < racy.explored  # some orders race, the forward-first ones do not


def test_exploration_judges_every_order_with_every_oracle_and_counts_per_oracle():
    """The happens-before oracle sees the unordered pair in every order, also those whose outputs agree."""
    outputs_differ = explore(mutant_target("snapshot_skipped"), CASE, bound=1000, oracles=frozenset({"differential"}))
    every_oracle = explore(mutant_target("snapshot_skipped"), CASE, bound=1000)
    assert len(every_oracle.failing) == every_oracle.explored > len(outputs_differ.failing)
    assert every_oracle.by_oracle["happens-before"] == every_oracle.explored
    assert every_oracle.by_oracle["differential"] == len(outputs_differ.failing)


def test_exploration_bound_is_reported():
    assert explore(ReferenceTarget(), CASE, bound=2).truncated


def test_failing_order_replays_from_its_command():
    result = run_case(mutant_target("snapshot_skipped"), CASE, schedule="random:1",
                      target_spec=TargetSpec(mutant="snapshot_skipped"))
    schedule = result.replay.split("--schedule ")[1].split()[0]
    again = execute(mutant_target("snapshot_skipped"), CASE, "cpu", schedule=schedule)
    assert again.trace == result.overlapped.trace
