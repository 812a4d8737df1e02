"""One GPU per xdist worker: the assignment, the errors, `-n auto`, and the report.

Fake NVML GPUs (tests/test_telemetry.py) stand in for a multi-GPU host; the gpu-marked test checks
the real pin on a GPU machine.
"""

from __future__ import annotations

import os
import sys
import xml.etree.ElementTree as ET
from types import SimpleNamespace

import pytest
from test_telemetry import FakeGpu, fake_nvml

from fixtures import gpu_workers
from fixtures.gpu_workers import (
    ASSIGNMENT_KEY,
    GpuAssignment,
    assign,
    verify_pin,
    visible_entries,
)

pytest_plugins = ["pytester"]


@pytest.fixture
def gpus(monkeypatch):
    """Six fake GPUs behind NVML; CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER restored afterwards."""
    fakes = [FakeGpu(i) for i in range(6)]
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(*fakes))
    for name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
        monkeypatch.setenv(name, "")  # recorded, so the plugin's own writes are undone too
        monkeypatch.delenv(name)
    return fakes


def infos(n: int):
    from harness.telemetry import list_gpus

    return list_gpus()[:n]


def config(device: str = "cuda", workers=None, share: bool = False):
    options = {"--harness-device": device, "--gpu-share": share}
    return SimpleNamespace(option=SimpleNamespace(numprocesses=workers, maxprocesses=None),
                           getoption=lambda name, default=None: options.get(name, default))


def test_worker_gw1_of_two_gets_the_second_gpu(gpus):
    two = infos(2)
    got = assign("gw1", visible_entries(two), two, workers=2, share=False)
    assert (got.entry, got.index, got.uuid, got.shared) == ("1", 1, gpus[1].uuid, False)


def test_a_preset_cuda_visible_devices_list_is_respected(gpus, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert visible_entries(infos(6)) == ["3", "5"]
    got = assign("gw1", ["3", "5"], infos(6), workers=2, share=False)
    assert (got.entry, got.uuid) == ("5", gpus[5].uuid)
    by_uuid = assign("gw0", [gpus[4].uuid[:12]], infos(6), workers=1, share=False)  # CUDA takes UUID prefixes
    assert by_uuid.index == 4


def test_more_workers_than_gpus_is_a_clear_error_unless_sharing_is_allowed(gpus):
    two = infos(2)
    with pytest.raises(pytest.UsageError, match=r"3 xdist workers but 2 GPU\(s\) visible .*-n 2.*--gpu-share"):
        assign("gw2", ["0", "1"], two, workers=3, share=False)
    with pytest.raises(pytest.UsageError, match="3 xdist workers"):  # every worker refuses, not only the last
        assign("gw0", ["0", "1"], two, workers=3, share=False)
    shared = assign("gw2", ["0", "1"], two, workers=3, share=True)
    assert (shared.entry, shared.shared) == ("0", True)
    with pytest.raises(pytest.UsageError, match="names no GPU"):
        assign("gw0", ["7"], two, workers=1, share=False)
    with pytest.raises(pytest.UsageError, match="gw<N>"):
        assign("master", ["0"], two, workers=1, share=False)


def test_auto_workers_is_the_gpu_count_on_cuda_and_xdists_default_on_the_cpu(gpus, monkeypatch):
    assert gpu_workers.pytest_xdist_auto_num_workers(config("cuda")) == 6
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,4")
    assert gpu_workers.pytest_xdist_auto_num_workers(config("cuda")) == 2
    assert gpu_workers.pytest_xdist_auto_num_workers(config("cpu")) is None
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(pytest.UsageError, match="needs NVML"):
        gpu_workers.pytest_xdist_auto_num_workers(config("cuda"))


def test_auto_workers_answers_before_xdists_own_count(pytester, monkeypatch):
    """xdist's hook is a plain one and firstresult: the GPU count must come first, in any load order."""
    import xdist.plugin

    for name in ("PYTEST_XDIST_AUTO_NUM_WORKERS", "PYTEST_XDIST_WORKER"):  # the controller, xdist's own count
        monkeypatch.delenv(name, raising=False)
    cpus = xdist.plugin.pytest_xdist_auto_num_workers(SimpleNamespace(option=SimpleNamespace(numprocesses="auto")))
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(*(FakeGpu(i) for i in range(cpus + 1))))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    cfg = pytester.parseconfigure("-p", "fixtures.plugin", "-p", "fixtures.gpu_workers", "-p", "xdist.plugin",
                                  "--harness-device", "cuda")
    assert cfg.hook.pytest_xdist_auto_num_workers(config=cfg) == cpus + 1


def test_the_controller_refuses_more_workers_than_gpus_before_any_starts(gpus, monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(pytest.UsageError, match=r"-n 3 on --harness-device cuda but 2 GPU\(s\)"):
        gpu_workers.pytest_configure(config("cuda", workers=3))
    gpu_workers.pytest_configure(config("cuda", workers=3, share=True))
    gpu_workers.pytest_configure(config("cpu", workers=3))
    header = gpu_workers.pytest_report_header(config("cuda", workers=2))
    assert header[1].strip().startswith("gw0 -> GPU 0") and header[2].strip().startswith("gw1 -> GPU 1")


def test_the_pin_is_verified_against_what_cuda_sees():
    pinned = GpuAssignment("gw1", "1", 1, "GPU-abcd-1234", "H200", False)
    verify_pin(pinned, 1, "abcd-1234")
    with pytest.raises(pytest.UsageError, match="CUDA sees 2 device"):
        verify_pin(pinned, 2, "abcd-1234")
    with pytest.raises(pytest.UsageError, match="CUDA device 0 is GPU-ffff"):
        verify_pin(pinned, 1, "ffff-0000")


def test_the_terminal_summary_lists_what_each_worker_reported():
    stash = pytest.Stash()
    pinned = GpuAssignment("gw1", "1", 1, "GPU-1", "H200", False)
    node = SimpleNamespace(workeroutput={gpu_workers.OUTPUT_KEY: vars(pinned)}, config=SimpleNamespace(stash=stash))
    gpu_workers.pytest_testnodedown(node, None)
    lines = []
    reporter = SimpleNamespace(write_sep=lambda sep, title: lines.append(title), write_line=lines.append)
    gpu_workers.pytest_terminal_summary(reporter, 0, SimpleNamespace(stash=stash))
    assert lines == ["GPU per xdist worker", "gw1 -> GPU 1 (H200, GPU-1), CUDA_VISIBLE_DEVICES=1"]


INNER = """
import os

def test_pinned():
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
"""


def run_as_worker(pytester, monkeypatch, worker: str, count: int, *args, cuda_initialised: bool = False):
    """An in-process run that believes it is xdist worker `worker` (a CPU run: the fake GPUs are not CUDA's)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: cuda_initialised)
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(count))
    pytester.makepyfile(INNER)
    return pytester.runpytest_inprocess("-p", "fixtures.plugin", "-p", "fixtures.gpu_workers", *args)


def test_a_worker_is_pinned_at_configure_and_the_assignment_is_in_the_junit_properties(pytester, monkeypatch, gpus):
    xml = pytester.path / "junit.xml"
    result = run_as_worker(pytester, monkeypatch, "gw1", 2, f"--junitxml={xml}")
    result.assert_outcomes(passed=1)
    props = {p.get("name"): p.get("value") for p in ET.parse(xml).getroot().iter("property")}
    assert props == {"xdist.worker": "gw1", "xdist.gpu_index": "1", "xdist.gpu_uuid": gpus[1].uuid,
                     "xdist.cuda_visible_devices": "1"}
    assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_cuda_initialised_before_the_pin_fails_loudly(pytester, monkeypatch, gpus):
    result = run_as_worker(pytester, monkeypatch, "gw1", 2, cuda_initialised=True)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*CUDA was initialised in xdist worker gw1 before it could be pinned*"])
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


@pytest.mark.gpu
def test_the_worker_sees_only_its_pinned_gpu(pytestconfig):
    import torch

    assignment = pytestconfig.stash.get(ASSIGNMENT_KEY, None)
    if assignment is None:
        pytest.skip("not an xdist worker: the pin applies under pytest -n")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == assignment.entry
    assert torch.cuda.device_count() == 1
    verify_pin(assignment, torch.cuda.device_count(), str(torch.cuda.get_device_properties(0).uuid))


@pytest.mark.parametrize("context_error", ["CUDA error: device-side assert triggered", None])
def test_a_test_that_breaks_the_cuda_context_is_named_by_the_device_tests_after_it(pytester, monkeypatch,
                                                                                  context_error):
    """On the H200 a device-side assert in one case failed the next case of its worker on the broken
    context, as if the fault were that case's own. (The context's health is faked: a CPU host has none.)"""
    from fixtures import plugin

    monkeypatch.setattr(plugin, "cuda_context_error", lambda: context_error)
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makepyfile(test_after="""
        def test_a_breaks_it(harness_device):
            assert False

        def test_b_on_the_device(harness_device):
            pass

        def test_c_without_the_device():
            pass
    """)
    run = pytester.runpytest("-p", "fixtures.plugin", "-rA")
    if context_error is None:
        run.assert_outcomes(failed=1, passed=2)
        assert "CUDA context" not in run.stdout.str()
        return
    run.assert_outcomes(failed=1, errors=1, passed=1)  # b fails at its setup: an error, in pytest's words
    run.stdout.fnmatch_lines(["*not run: the CUDA context of this process was lost in test_after.py::test_a_breaks_it "
                              "(CUDA error: device-side assert triggered)*"])
    run.stdout.fnmatch_lines(["ERROR test_after.py::test_b_on_the_device*", "FAILED test_after.py::test_a_breaks_it*"])
    assert "this failure left the CUDA context of this process unusable" in run.stdout.str()
