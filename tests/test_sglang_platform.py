"""The simulator as the device SGLang's code sees (`harness/sglang_target/platform.py`): torch's
PrivateUse1 device `streamsim`, whose events record on the stream given or on the current one, as CUDA
does, so that an event SGLang records on the wrong stream orders nothing and the tracker says so."""

from __future__ import annotations

import platform

import pytest
import torch

from harness.device import SimDevice
from harness.sglang_target.platform import (SIM_BACKEND, SimDeviceModule, SimStream, bound_heap_growth,
                                            register_sim_device)

# Registering the simulator renames torch's PrivateUse1 slot for the rest of the process, and from then on torch
# takes it for the process's accelerator: `Tensor.pin_memory()`, which the CUDA device uses to stage host data
# without a sync, asks it for pinned memory and fails. A `--target sglang --device cpu` process never pins; a test
# process that goes on to CUDA tests does (seen on the H200 with one pytest worker: 31 later CUDA tests failed).
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason=(
    "registers torch's PrivateUse1 device for the rest of the process, which breaks the CUDA tests after it "
    "(pin_memory); these tests are CPU-simulator tests and run where no GPU is visible, as in CI"))


def _program(record_on_schedule: bool):
    """forward: read the table, record read-done; schedule: wait on it, then write the table."""
    device = SimDevice()
    module = torch.get_device_module(register_sim_device())
    with SimDeviceModule.bind(device):
        with device.stream(device.forward_stream):
            device.launch("forward.read", lambda: None, reads={"req_to_token": None})
            event = module.Event()
            event.record(SimStream(device, device.schedule_stream) if record_on_schedule else None)
        SimStream(device, device.schedule_stream).wait_event(event)
        with device.stream(device.schedule_stream):
            device.launch("scheduler.write", lambda: None, writes={"req_to_token": None})
        device.synchronize()
    return device, event


def test_the_simulator_is_the_device_module_sglang_gets():
    assert register_sim_device() == SIM_BACKEND == register_sim_device()  # once per process
    assert isinstance(torch.get_device_module(SIM_BACKEND), SimDeviceModule)


def test_an_event_recorded_on_the_current_stream_orders_the_scheduler_after_the_read():
    device, event = _program(record_on_schedule=False)
    assert event.stream is device.forward_stream
    assert device.tracker.conflicts == []


def test_an_event_recorded_on_the_wrong_stream_orders_nothing_and_the_tracker_sees_the_race():
    device, event = _program(record_on_schedule=True)
    assert event.stream is device.schedule_stream
    [conflict] = device.tracker.conflicts
    assert conflict.earlier.op == "forward.read" and conflict.later.op == "scheduler.write"


def test_host_work_runs_after_what_its_stream_was_given_and_is_tracked():
    device, seen = SimDevice(), []
    table = torch.zeros(2)
    with device.stream(device.forward_stream):
        device.launch("fill", lambda: table.fill_(7), writes={"meta.fresh": None})
        with device.host_work("copy_", reads={"meta.fresh": None}, writes={"meta.static": None}):
            seen.append(table.clone())
    with device.stream(device.schedule_stream):  # unordered against the host work's read
        device.launch("overwrite", lambda: None, writes={"meta.fresh": None})
    device.synchronize()
    assert seen[0].tolist() == [7.0, 7.0]
    assert ("copy_", "overwrite") in [(c.earlier.op, c.later.op) for c in device.tracker.conflicts]


@pytest.mark.gpu
def test_a_stream_sglang_creates_during_a_step_is_a_tracked_harness_stream():
    """0.5.19's `run_event_loop` makes its own schedule stream (`device_module.Stream(priority=0)`): on CUDA
    it must be a stream of the harness, whose wait on the event orders the scheduler's writes after the read,
    and whose work lands on that very stream (not on one the harness makes up)."""
    from harness.device import make_device
    from harness.sglang_target.platform import CudaEventBridge

    device = make_device("cuda")
    bridge, real = CudaEventBridge(device), torch.cuda.Stream
    with bridge.bound():
        made = torch.cuda.Stream(priority=0)
        assert isinstance(made, torch.cuda.ExternalStream) and bridge.stream_of(made.cuda_stream).name == "sglang-new"
        with device.stream(device.forward_stream):
            device.launch("forward.read", lambda: None, reads={"req_to_token": None})
            event = torch.cuda.Event()
            event.record()
            bridge.recorded(event, torch.cuda.current_stream())  # what a record issued by SGLang's code tells it
        made.wait_event(event)
        with torch.cuda.stream(made), device.stream(bridge.stream_of(torch.cuda.current_stream().cuda_stream)):
            device.launch("scheduler.write", lambda: None, writes={"req_to_token": None})
    device.synchronize()
    assert device.tracker.conflicts == []
    assert torch.cuda.Stream is real  # restored after the step


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the heap bound is glibc's mallopt")
def test_the_heap_bound_applies_under_glibc():
    """`bound_heap_growth` fixes glibc's mmap threshold (DSV4-sized CPU campaigns ran out of memory without it);
    the target applies it when it is built, so it must say it applied where glibc is the libc."""
    assert bound_heap_growth() is True
    big = torch.empty(64 * 2**20, dtype=torch.uint8)  # still allocates and frees as before
    del big
