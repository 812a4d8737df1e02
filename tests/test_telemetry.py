"""NVML telemetry: decoding, unsupported fields, XIDs, environment-suspect marking, and the pytest plugin.

A fake `pynvml` (put into sys.modules) plays the GPU, so every path runs on the CPU; one gpu-marked
test reads the real GPU.
"""

from __future__ import annotations

import json
import sys
import types
import xml.etree.ElementTree as ET
from types import SimpleNamespace

import pytest

from harness.errors import EnvironmentBroken
from harness.telemetry import (
    TelemetryWindow,
    annotate_summary,
    decode_clock_events,
    list_gpus,
    mark_suspect,
)

pytest_plugins = ["pytester"]

NOT_SUPPORTED, NOT_FOUND, TIMEOUT, LIBRARY_NOT_FOUND, FUNCTION_NOT_FOUND = 3, 6, 10, 12, 13
IDLE, APP_CLOCKS, SW_POWER_CAP, HW_THERMAL = 0x1, 0x2, 0x4, 0x40
ECC = {(t, c): 0 for t in (0, 1) for c in (0, 1)}  # (error type, counter type) -> count


class FakeGpu:
    """One GPU as NVML reports it; None for a field means NVML says NotSupported."""

    def __init__(self, index: int, *, reasons: int = IDLE, ecc: dict | None = ECC, remapped=(0, 0, 0, 0),
                 events: bool = True):
        self.index, self.uuid, self.name = index, f"GPU-0000000{index}-fake-uuid", "Fake H200"
        self.reasons, self.remapped, self.events = reasons, remapped, events
        self.ecc = dict(ecc) if ecc is not None else None
        self.sets: list[list] = []

    def xid(self, code: int) -> None:
        for queue in self.sets:
            queue.append(SimpleNamespace(eventData=code, eventType=0x8))


def fake_nvml(*gpus: FakeGpu, init_error: int | None = None, events_api: bool = True) -> types.ModuleType:
    nvml = types.ModuleType("pynvml")

    class NVMLError(Exception):
        def __init__(self, value):
            super().__init__(value)
            self.value = value

        def __str__(self):
            return {NOT_SUPPORTED: "Not Supported", TIMEOUT: "Timeout", NOT_FOUND: "Not Found",
                    LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
                    FUNCTION_NOT_FOUND: "Function Not Found"}.get(self.value, f"error {self.value}")

    def init():
        if init_error is not None:
            raise NVMLError(init_error)

    def by_uuid(uuid):
        for gpu in gpus:
            if gpu.uuid == uuid:
                return gpu
        raise NVMLError(NOT_FOUND)

    def by_index(i):
        if not 0 <= i < len(gpus):
            raise NVMLError(2)
        return gpus[i]

    def ecc(gpu, error_type, counter_type):
        if gpu.ecc is None:
            raise NVMLError(NOT_SUPPORTED)
        return gpu.ecc[(error_type, counter_type)]

    def remapped(gpu):
        if gpu.remapped is None:
            raise NVMLError(NOT_SUPPORTED)
        return gpu.remapped

    def register(gpu, types_, queue):
        if not gpu.events:
            raise NVMLError(NOT_SUPPORTED)
        gpu.sets.append(queue)

    def wait(queue, timeout_ms):
        if not queue:
            raise NVMLError(TIMEOUT)
        return queue.pop(0)

    def free(queue):
        for gpu in gpus:
            if queue in gpu.sets:
                gpu.sets.remove(queue)

    def event_reasons(gpu):
        if not events_api:
            raise NVMLError(FUNCTION_NOT_FOUND)
        return gpu.reasons

    nvml.__dict__.update(
        NVMLError=NVMLError, NVML_ERROR_NOT_SUPPORTED=NOT_SUPPORTED, NVML_ERROR_TIMEOUT=TIMEOUT,
        NVML_ERROR_FUNCTION_NOT_FOUND=FUNCTION_NOT_FOUND, NVML_CLOCK_SM=1, NVML_CLOCK_MEM=2,
        NVML_MEMORY_ERROR_TYPE_CORRECTED=0, NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1, NVML_VOLATILE_ECC=0,
        NVML_AGGREGATE_ECC=1, nvmlEventTypeXidCriticalError=0x8,
        nvmlInit=init, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: len(gpus),
        nvmlDeviceGetHandleByIndex=by_index, nvmlDeviceGetHandleByUUID=by_uuid,
        nvmlDeviceGetIndex=lambda g: g.index, nvmlDeviceGetName=lambda g: g.name.encode(),  # old pynvml: bytes
        nvmlDeviceGetUUID=lambda g: g.uuid, nvmlSystemGetDriverVersion=lambda: "570.86.15",
        nvmlDeviceGetClockInfo=lambda g, kind: 1980 if kind == 1 else 3201,
        nvmlDeviceGetCurrentClocksEventReasons=event_reasons,
        nvmlDeviceGetCurrentClocksThrottleReasons=lambda g: g.reasons,
        nvmlDeviceGetMemoryInfo=lambda g: SimpleNamespace(used=1 << 30, total=141 << 30, free=140 << 30),
        nvmlDeviceGetTotalEccErrors=ecc, nvmlDeviceGetRemappedRows=remapped,
        nvmlEventSetCreate=list, nvmlDeviceRegisterEvents=register, nvmlEventSetWait_v2=wait,
        nvmlEventSetFree=free,
    )
    return nvml


@pytest.fixture
def gpu(monkeypatch) -> FakeGpu:
    """A clean fake GPU 0, installed as pynvml."""
    fake = FakeGpu(0)
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(fake))
    return fake


def test_clock_event_reasons_decode_to_names():
    assert decode_clock_events(0) == []
    assert decode_clock_events(IDLE | HW_THERMAL) == ["gpu_idle", "hw_thermal_slowdown"]
    assert decode_clock_events(0x800) == ["unknown_0x800"]


def test_a_clean_gpu_is_recorded_and_not_suspect(gpu):
    with TelemetryWindow(0) as window:
        pass
    record = window.record
    assert record.available and record.suspect_reasons() == []
    assert record.after.name == "Fake H200" and record.after.uuid == gpu.uuid and record.after.driver == "570.86.15"
    assert (record.after.sm_clock_mhz, record.after.mem_clock_mhz) == (1980, 3201)
    assert record.after.clock_events == ["gpu_idle"] and record.xids == []
    assert record.after.remapped_rows == {"correctable": 0, "uncorrectable": 0, "pending": 0, "failure": 0}
    props = dict(record.properties())
    assert props["gpu.uuid"] == gpu.uuid and props["gpu.environment_suspect"] == "false"
    assert props["gpu.xids"] == "none" and props["gpu.ecc.volatile_uncorrected"] == "0"
    assert "gpu.suspect_reasons" not in props
    json.dumps(record.to_dict())
    assert gpu.sets == []  # the event set was freed


def test_the_window_finds_the_gpu_by_uuid_and_by_cuda_visible_devices(monkeypatch):
    gpus = [FakeGpu(0), FakeGpu(1)]
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(*gpus))
    with TelemetryWindow(gpus[1].uuid) as by_uuid:
        pass
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with TelemetryWindow() as by_env:
        pass
    assert by_uuid.record.after.index == by_env.record.after.index == 1
    assert [g.uuid for g in list_gpus()] == [g.uuid for g in gpus]


def test_thermal_throttle_is_suspect_and_idle_or_app_clocks_are_not(gpu):
    gpu.reasons = IDLE | APP_CLOCKS
    with TelemetryWindow() as quiet:
        pass
    assert quiet.record.suspect_reasons() == []
    gpu.reasons = HW_THERMAL | SW_POWER_CAP
    with TelemetryWindow() as hot:
        pass
    reasons = hot.record.suspect_reasons()
    assert any("hw_thermal_slowdown" in r for r in reasons) and any("sw_power_cap" in r for r in reasons)
    assert dict(hot.record.properties())["gpu.environment_suspect"] == "true"


def test_an_uncorrected_ecc_error_during_the_run_is_suspect_and_a_corrected_one_is_not(gpu):
    with TelemetryWindow() as corrected:
        gpu.ecc[(0, 0)] += 5  # corrected, volatile
    assert corrected.record.suspect_reasons() == []
    with TelemetryWindow() as uncorrected:
        gpu.ecc[(1, 0)] += 1  # uncorrected, volatile
    assert uncorrected.record.suspect_reasons() == [
        "uncorrected ECC errors rose during the run (volatile_uncorrected: 0 -> 1)"]


def test_a_hardware_xid_during_the_run_is_collected_and_suspect(gpu):
    gpu.xid(48)  # before the window: not this run's
    with TelemetryWindow() as window:
        gpu.xid(79)
    assert window.record.xids == [{"xid": 79, "event_type": 0x8}]
    assert window.record.suspect_reasons() == ["XID 79 during the run"]
    assert dict(window.record.properties())["gpu.xids"] == "79"


def test_an_xid_from_an_applications_own_fault_is_recorded_but_not_suspect(gpu):
    with TelemetryWindow() as window:
        gpu.xid(43)  # what a device-side assert in the case raised on the H200
    assert window.record.xids == [{"xid": 43, "event_type": 0x8}]
    assert window.record.suspect_reasons() == []


def test_pending_remapped_rows_are_suspect(gpu):
    gpu.remapped = (0, 1, 1, 0)
    with TelemetryWindow() as window:
        pass
    assert window.record.suspect_reasons() == ["remapped rows pending (the GPU needs a reset)"]


def test_not_supported_fields_are_none_never_a_crash(monkeypatch):
    gpu = FakeGpu(0, ecc=None, remapped=None, events=False)
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(gpu, events_api=False))
    gpu.reasons = HW_THERMAL  # read through the older ...ClocksThrottleReasons
    with TelemetryWindow() as window:
        pass
    record = window.record
    assert record.available and record.xids is None and record.xid_unsupported == "Not Supported"
    assert record.after.ecc == dict.fromkeys(record.after.ecc) and record.after.remapped_rows is None
    assert record.after.unsupported["remapped_rows"] == "Not Supported"
    assert record.after.clock_events == ["hw_thermal_slowdown"]
    props = dict(record.properties())
    assert props["gpu.ecc.aggregate_uncorrected"] == "unsupported"
    assert props["gpu.xids"] == "unsupported: Not Supported"
    assert len(record.suspect_reasons()) == 1  # the throttle; unsupported counters say nothing


@pytest.mark.parametrize("nvml", [None, "no-driver"], ids=["no-package", "no-driver"])
def test_without_nvml_the_window_is_unavailable_on_the_cpu_and_broken_when_required(monkeypatch, nvml):
    module = None if nvml is None else fake_nvml(init_error=LIBRARY_NOT_FOUND)
    monkeypatch.setitem(sys.modules, "pynvml", module)  # None: `import pynvml` raises ImportError
    with TelemetryWindow() as window:
        pass
    assert not window.record.available
    assert ("not installed" if nvml is None else "Shared Library Not Found") in window.record.reason
    assert window.record.suspect_reasons() == []
    assert window.record.properties()[0][1].startswith("unavailable: ")
    with pytest.raises(EnvironmentBroken, match="requested on CUDA"):
        TelemetryWindow(required=True).start()


def test_mark_suspect_and_the_summary_section(gpu):
    gpu.reasons = HW_THERMAL
    with TelemetryWindow() as hot:
        pass
    summary = annotate_summary({"findings": [{"oracle": "differential"}]}, hot)
    assert summary["findings"][0]["environment_suspect"] is True
    assert "hw_thermal_slowdown" in summary["findings"][0]["suspect_reasons"][0]
    assert summary["telemetry"]["available"] and summary["telemetry"]["suspect_reasons"]
    json.dumps(summary)
    gpu.reasons = IDLE
    with TelemetryWindow() as clean:
        pass
    assert mark_suspect([{}], clean.record) == [{"environment_suspect": False, "suspect_reasons": []}]


def test_mark_suspect_without_telemetry_says_unknown(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with TelemetryWindow() as window:
        pass
    assert mark_suspect([{}], window) == [{"environment_suspect": None, "suspect_reasons": []}]


INNER = """
def test_passes():
    pass

def test_fails():
    assert False
"""


def test_the_plugin_records_telemetry_and_marks_a_failure_on_a_throttled_gpu(pytester, monkeypatch, gpu):
    gpu.reasons = HW_THERMAL
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makepyfile(INNER)
    xml = pytester.path / "junit.xml"
    result = pytester.runpytest_inprocess("-p", "fixtures.plugin", "-p", "fixtures.telemetry",
                                          "--harness-device", "cuda", f"--junitxml={xml}")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*environment-suspect*", "*hw_thermal_slowdown*"])
    cases = {c.get("name"): {p.get("name"): p.get("value") for p in c.iter("property")}
             for c in ET.parse(xml).getroot().iter("testcase")}
    assert cases["test_passes"]["gpu.uuid"] == gpu.uuid
    assert cases["test_passes"]["gpu.environment_suspect"] == "true"
    assert "environment-suspect" not in cases["test_passes"]  # only a failure is marked
    assert "hw_thermal_slowdown" in cases["test_fails"]["environment-suspect"]


def test_the_plugin_stays_out_of_cpu_runs(pytester, monkeypatch, gpu):
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makepyfile(INNER)
    xml = pytester.path / "junit.xml"
    pytester.runpytest_inprocess("-p", "fixtures.plugin", "-p", "fixtures.telemetry", f"--junitxml={xml}")
    assert not list(ET.parse(xml).getroot().iter("property"))


@pytest.mark.gpu
def test_real_gpu_telemetry_reads_real_values():
    import torch

    torch.ones(1 << 20, device="cuda").sum().item()  # a context and some work inside the window
    with TelemetryWindow(required=True) as window:
        torch.ones(1 << 24, device="cuda").mul_(2).sum().item()
    record = window.record
    snap = record.after
    assert record.available and snap.uuid.startswith(("GPU-", "MIG-")) and snap.name and snap.driver
    assert snap.sm_clock_mhz > 0 and snap.mem_clock_mhz > 0 and snap.memory_total_bytes > snap.memory_used_bytes > 0
    assert snap.clock_events is not None and isinstance(record.xids, list | type(None))
    assert str(torch.cuda.get_device_properties(0).uuid).lower() in snap.uuid.lower()
    json.dumps(record.to_dict())
