"""One interface, two devices: real CUDA streams, or the CPU stream/event simulator.

The system under test issues every tensor operation through `Device.launch`, declaring what it
reads and writes. On CUDA the operation runs at once on the current stream; on the CPU it is queued
and a schedule policy later picks an order allowed by stream order and event edges. Both feed the
same happens-before tracker in host issue order, so its verdict does not depend on the device.
"""

from __future__ import annotations

from typing import Optional

import torch

from harness.device import gates
from harness.device.base import Device, Event, GraphCapture, OpFailed, Stream
from harness.device.cuda import CudaDevice
from harness.device.kind import DeviceKind
from harness.device.sim import SimDevice
from harness.errors import EnvironmentBroken, InvalidArgument
from harness.telemetry import cuda_context_error

__all__ = ["context_error", "Device", "DeviceKind", "Event", "GraphCapture", "OpFailed", "Stream", "SimDevice", "make_device",
           "resolve_device"]


def resolve_device(name: str, *, option: str = "device") -> DeviceKind:
    """`auto` picks CUDA when a device is present; `cuda` without one is refused here, before any work.
    The kind it returns is what every layer below asks, so none resolves the name again. `option`: what the
    caller calls the value, in the messages (the command line: --device)."""
    if name not in ("cpu", "cuda", "auto"):
        raise InvalidArgument(f"{option}={name!r} is not one of: cpu, cuda, auto")
    if name == "cpu":
        return DeviceKind.CPU
    if not torch.cuda.is_available():
        if name == "auto":
            return DeviceKind.CPU
        raise EnvironmentBroken(f"{option} cuda: no CUDA device is visible (torch.cuda.is_available() is False)")
    gates.require_driver()  # the race windows' gates
    return DeviceKind.CUDA


def make_device(name: str, *, schedule: str = "adversarial", observe: bool = False) -> Device:
    """`observe`: the observer feeds the tracker what the code really touches (`harness/observe/`)."""
    if resolve_device(name) is DeviceKind.CPU:
        return SimDevice(schedule=schedule, observe=observe)
    return CudaDevice(observe=observe)


def context_error(name: str) -> Optional[str]:
    """On CUDA, the first line of the sticky error that left this process's context unusable (a device-side assert,
    an illegal address: every later CUDA call fails with it), or None while it is usable; None on the CPU."""
    return None if DeviceKind(name) is DeviceKind.CPU else cuda_context_error()
