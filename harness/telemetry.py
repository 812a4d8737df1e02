"""NVML telemetry around a run: what the GPU was, how it was clocked, and whether it misbehaved.

A finding made on a throttled GPU, one that logged uncorrected ECC errors, hardware XID events or
pending row remaps, may be the hardware's fault rather than the target's: such findings are marked
environment-suspect (XIDs that an application's own fault raises are recorded, not suspect). On a
machine without NVML (CPU CI) a window reports ``available: False`` with the reason and never
raises; only a caller that requires telemetry gets `EnvironmentBroken`.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Optional

from harness.errors import EnvironmentBroken


def cuda_context_error() -> Optional[str]:
    """The first line of the sticky error of this process's CUDA context (a device-side assert or an illegal
    address poisons every later CUDA call), or None when it is sound or CUDA never started here. Read through
    `sys.modules`, so that asking never imports torch nor starts CUDA (the pytest plugin asks after every
    failed test, the engine after a crashed run, an isolated child after each case)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    try:
        torch.cuda.synchronize()
    except RuntimeError as exc:
        return str(exc).strip().splitlines()[0]
    return None


# NVML's clocks-event (formerly "throttle") reason bits, by the names of nvmlClocksEventReason*.
CLOCK_EVENT_NAMES = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# Thermal, power and hardware slowdowns: the GPU is not running as configured. Idle, application
# clock settings, sync boost and display settings are normal operation.
SUSPECT_CLOCK_EVENTS = frozenset({"sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                                  "hw_power_brake_slowdown"})
ECC_COUNTERS = ("volatile_corrected", "volatile_uncorrected", "aggregate_corrected", "aggregate_uncorrected")
# XIDs a faulting application causes in its own context (13 graphics engine exception, 31 memory page
# fault, 43 channel stopped, 45 preemptive cleanup after those): the finding of a case that made an
# illegal access is the target's, not the GPU's. Every other XID (48 double-bit ECC, 63/64 row
# remapping, 74 NVLink, 79 fallen off the bus, 94/95 ECC containment, ...) points at the hardware.
APPLICATION_XIDS = frozenset({13, 31, 43, 45})
MAX_XID_EVENTS = 256  # a drain stops here: an XID storm must not stall the run

Gpu = int | str | None  # NVML index, a UUID ("GPU-..."), or None: the first GPU CUDA sees


class NvmlUnavailable(Exception):
    """NVML cannot be used here; the message says why (no package, no driver, no such GPU)."""


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    name: str


@dataclass
class GpuSnapshot:
    """One reading of one GPU; a field NVML does not support is None, with the reason in `unsupported`."""

    index: int | None = None
    name: str | None = None
    uuid: str | None = None
    driver: str | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    clock_event_mask: int | None = None
    clock_events: list[str] | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    ecc: dict[str, int | None] = field(default_factory=dict)
    remapped_rows: dict[str, int] | None = None
    unsupported: dict[str, str] = field(default_factory=dict)
    taken_at: float = 0.0


@dataclass
class TelemetryRecord:
    """A window's result: snapshots before and after, and the XID events seen in between."""

    available: bool
    reason: str | None = None  # why telemetry is unavailable
    before: GpuSnapshot | None = None
    after: GpuSnapshot | None = None
    xids: list[dict] | None = None  # None: XID events could not be watched (see xid_unsupported)
    xid_unsupported: str | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "suspect_reasons": self.suspect_reasons()}

    def suspect_reasons(self) -> list[str]:
        """Why a finding on this GPU may be the environment's fault; empty on a clean GPU."""
        if not self.available:
            return []
        reasons = []
        seen: dict[str, list[str]] = {}
        for when, snap in (("before", self.before), ("after", self.after)):
            for name in (snap.clock_events or []) if snap else []:
                if name in SUSPECT_CLOCK_EVENTS:
                    seen.setdefault(name, []).append(when)
        reasons += [f"clock event {name} active ({', '.join(whens)} the run)" for name, whens in seen.items()]
        latest = self.after or self.before
        for counter in ("volatile_uncorrected", "aggregate_uncorrected"):
            was, now = self.before.ecc.get(counter), latest.ecc.get(counter)
            if was is not None and now is not None and now > was:
                reasons.append(f"uncorrected ECC errors rose during the run ({counter}: {was} -> {now})")
                break
        reasons += [f"XID {x['xid']} during the run" for x in self.xids or [] if x["xid"] not in APPLICATION_XIDS]
        rows = latest.remapped_rows or {}
        if rows.get("pending"):
            reasons.append("remapped rows pending (the GPU needs a reset)")
        if rows.get("failure"):
            reasons.append("row remapping failed")
        return reasons

    def properties(self) -> list[tuple[str, str]]:
        """Flat (name, value) pairs for JUnit properties."""
        if not self.available:
            return [("gpu.telemetry", f"unavailable: {self.reason}")]
        snap, before = self.after or self.before, self.before
        events = sorted(set(before.clock_events or []) | set(snap.clock_events or []))
        pairs = [("gpu.telemetry", "available"), ("gpu.name", snap.name), ("gpu.uuid", snap.uuid),
                 ("gpu.index", snap.index), ("gpu.driver", snap.driver), ("gpu.sm_clock_mhz", snap.sm_clock_mhz),
                 ("gpu.mem_clock_mhz", snap.mem_clock_mhz),
                 ("gpu.clock_events", ",".join(events) if before.clock_events is not None else None),
                 ("gpu.memory_used_bytes", snap.memory_used_bytes), ("gpu.memory_total_bytes", snap.memory_total_bytes)]
        pairs += [(f"gpu.ecc.{name}", snap.ecc.get(name)) for name in ECC_COUNTERS]
        pairs += [(f"gpu.remapped_rows.{name}", value) for name, value in (snap.remapped_rows or {}).items()]
        xids = (f"unsupported: {self.xid_unsupported}" if self.xids is None
                else ",".join(str(x["xid"]) for x in self.xids) or "none")
        reasons = self.suspect_reasons()
        pairs += [("gpu.xids", xids), ("gpu.environment_suspect", "true" if reasons else "false")]
        if reasons:
            pairs.append(("gpu.suspect_reasons", "; ".join(reasons)))
        return [(name, "unsupported" if value is None else str(value)) for name, value in pairs]


def _load():
    """pynvml, initialised (the caller shuts it down)."""
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailable(f"nvidia-ml-py (pynvml) is not installed: {exc}") from None
    try:
        pynvml.nvmlInit()
    except (pynvml.NVMLError, OSError) as exc:
        raise NvmlUnavailable(f"NVML did not initialise (no NVIDIA driver?): {exc}") from None
    return pynvml


def _shutdown(nvml) -> None:
    try:
        nvml.nvmlShutdown()
    except nvml.NVMLError:
        pass  # nothing left to release


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def visible_entries(gpus: list[GpuInfo], environ=os.environ) -> list[str]:
    """The GPUs one-per-worker runs draw from (pytest's xdist workers, `harness run --workers`): a
    pre-set CUDA_VISIBLE_DEVICES, else every NVML index."""
    preset = environ.get("CUDA_VISIBLE_DEVICES")
    if preset is not None:
        return [e.strip() for e in preset.split(",") if e.strip()]
    return [str(g.index) for g in gpus]


def list_gpus() -> list[GpuInfo]:
    """Every GPU NVML sees, in NVML (PCI bus) order, without initialising CUDA."""
    nvml = _load()
    try:
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        return [GpuInfo(i, _text(nvml.nvmlDeviceGetUUID(h)), _text(nvml.nvmlDeviceGetName(h)))
                for i, h in enumerate(handles)]
    except nvml.NVMLError as exc:
        raise NvmlUnavailable(f"NVML could not list the GPUs: {exc}") from None
    finally:
        _shutdown(nvml)


def _handle(nvml, gpu: Gpu):
    """NVML's handle for `gpu`; None means the first entry of CUDA_VISIBLE_DEVICES, else GPU 0."""
    if gpu is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        gpu = visible.split(",")[0].strip() if visible is not None else 0
    try:
        if isinstance(gpu, int) or gpu.isdigit():
            return nvml.nvmlDeviceGetHandleByIndex(int(gpu))
        return nvml.nvmlDeviceGetHandleByUUID(gpu)
    except nvml.NVMLError as exc:
        raise NvmlUnavailable(f"NVML has no GPU {gpu!r}: {exc}") from None


def _clock_event_mask(nvml, handle) -> int:
    """nvmlDeviceGetCurrentClocksEventReasons, or the older ...ClocksThrottleReasons."""
    current = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if current is not None:
        try:
            return current(handle)
        except nvml.NVMLError as exc:
            if exc.value != nvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                raise
    return nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)


def decode_clock_events(mask: int) -> list[str]:
    names = []
    for bit in range(mask.bit_length()):
        if mask >> bit & 1:
            names.append(CLOCK_EVENT_NAMES.get(1 << bit, f"unknown_0x{1 << bit:x}"))
    return names


def snapshot(nvml, handle) -> GpuSnapshot:
    """Read every field; NVML refusing one (NotSupported on this GPU, no permission) leaves it None."""
    snap = GpuSnapshot(taken_at=time.time())

    def read(name, fn, *args):
        try:
            return fn(*args)
        except nvml.NVMLError as exc:
            snap.unsupported[name] = str(exc)
            return None

    snap.index = read("index", nvml.nvmlDeviceGetIndex, handle)
    snap.name = _optional_text(read("name", nvml.nvmlDeviceGetName, handle))
    snap.uuid = _optional_text(read("uuid", nvml.nvmlDeviceGetUUID, handle))
    snap.driver = _optional_text(read("driver", nvml.nvmlSystemGetDriverVersion))
    snap.sm_clock_mhz = read("sm_clock_mhz", nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM)
    snap.mem_clock_mhz = read("mem_clock_mhz", nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_MEM)
    snap.clock_event_mask = read("clock_events", _clock_event_mask, nvml, handle)
    if snap.clock_event_mask is not None:
        snap.clock_events = decode_clock_events(snap.clock_event_mask)
    memory = read("memory", nvml.nvmlDeviceGetMemoryInfo, handle)
    if memory is not None:
        snap.memory_used_bytes, snap.memory_total_bytes = int(memory.used), int(memory.total)
    for name in ECC_COUNTERS:
        counter, kind = name.split("_")
        snap.ecc[name] = read(f"ecc.{name}", nvml.nvmlDeviceGetTotalEccErrors, handle,
                              nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED if kind == "uncorrected"
                              else nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                              nvml.NVML_VOLATILE_ECC if counter == "volatile" else nvml.NVML_AGGREGATE_ECC)
    rows = read("remapped_rows", nvml.nvmlDeviceGetRemappedRows, handle)
    if rows is not None:
        snap.remapped_rows = dict(zip(("correctable", "uncorrectable", "pending", "failure"), map(int, rows)))
    return snap


def _optional_text(value) -> str | None:
    return None if value is None else _text(value)


class TelemetryWindow:
    """Snapshots before and after a run, and the XID events in between.

    ``with TelemetryWindow(gpu) as window: ...`` then ``window.record``; or ``start()`` / ``stop()``.
    `required`: telemetry was asked for on CUDA, so NVML missing is `EnvironmentBroken`, not a record
    saying ``available: False``.
    """

    def __init__(self, gpu: Gpu = None, *, required: bool = False):
        self.gpu, self.required = gpu, required
        self.record: TelemetryRecord | None = None
        self._nvml = self._gpu_handle = self._events = None
        self._started = 0.0

    def start(self) -> TelemetryWindow:
        self._started = time.perf_counter()
        try:
            self._nvml = _load()
            self._gpu_handle = _handle(self._nvml, self.gpu)
        except NvmlUnavailable as exc:
            if self._nvml is not None:
                _shutdown(self._nvml)
                self._nvml = None
            if self.required:
                raise EnvironmentBroken(f"GPU telemetry was requested on CUDA but {exc}") from None
            self.record = TelemetryRecord(available=False, reason=str(exc))
            return self
        nvml = self._nvml
        self.record = TelemetryRecord(available=True, before=snapshot(nvml, self._gpu_handle))
        try:
            self._events = nvml.nvmlEventSetCreate()
            nvml.nvmlDeviceRegisterEvents(self._gpu_handle, nvml.nvmlEventTypeXidCriticalError, self._events)
            self.record.xids = []
        except nvml.NVMLError as exc:
            self.record.xid_unsupported = str(exc)
            self._free_events()
        return self

    def stop(self) -> TelemetryRecord:
        if self.record is None:
            raise RuntimeError("TelemetryWindow.stop() before start()")
        nvml = self._nvml
        if nvml is not None:
            try:
                if self._events is not None:
                    self._drain()
                self.record.after = snapshot(nvml, self._gpu_handle)
            finally:
                self._free_events()
                _shutdown(nvml)
                self._nvml = None
        self.record.seconds = round(time.perf_counter() - self._started, 6)
        return self.record

    def _drain(self) -> None:
        nvml = self._nvml
        while len(self.record.xids) < MAX_XID_EVENTS:
            try:
                data = nvml.nvmlEventSetWait_v2(self._events, 0)
            except nvml.NVMLError as exc:
                if exc.value != nvml.NVML_ERROR_TIMEOUT:  # timeout: nothing more pending
                    self.record.xid_unsupported = f"reading XID events failed: {exc}"
                return
            self.record.xids.append({"xid": int(data.eventData), "event_type": int(data.eventType)})

    def _free_events(self) -> None:
        if self._events is not None:
            try:
                self._nvml.nvmlEventSetFree(self._events)
            except self._nvml.NVMLError:
                pass  # the set is gone with the NVML session anyway
            self._events = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


Telemetry = TelemetryWindow | TelemetryRecord


def _record(telemetry: Telemetry) -> TelemetryRecord:
    record = telemetry.record if isinstance(telemetry, TelemetryWindow) else telemetry
    if record is None:
        raise RuntimeError("the telemetry window was never started")
    return record


def mark_suspect(findings: list[dict], telemetry: Telemetry) -> list[dict]:
    """Add ``environment_suspect`` (None when telemetry was unavailable: unknown) and
    ``suspect_reasons`` to each finding dict, in place; returns the list."""
    record = _record(telemetry)
    reasons = record.suspect_reasons()
    for finding in findings:
        finding["environment_suspect"] = bool(reasons) if record.available else None
        finding["suspect_reasons"] = list(reasons)
    return findings


def annotate_summary(summary: dict, telemetry: Telemetry) -> dict:
    """Mark the summary's findings and add its ``telemetry`` section, in place; returns the summary."""
    mark_suspect(summary.get("findings", []), telemetry)
    summary["telemetry"] = _record(telemetry).to_dict()
    return summary
