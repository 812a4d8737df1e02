"""The static contract check on the installed sglang: the DSV4 backend, its metadata and the runners are
quiet (the TRT-LLM and mega kernels' methods are subclass hooks, not breaks), and the #35947 break planted
in a copy of the real backend module is named with its reading line.

Needs sglang 0.5.23 and its CPU import deps (see harness/sglang_target/__init__.py); skipped without them.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from harness.sglang_target.api import prepare_triton

# Before sglang (which imports triton) and only where sglang is here, as the target chooses: a
# process-wide TRITON_INTERPRET set at collection would make every later Triton kernel of a GPU run
# (and its child processes) interpreted.
if importlib.util.find_spec("sglang") is not None:
    prepare_triton()

pytest.importorskip("sglang", reason="the sglang package is not installed: the static check on sglang needs "
                                     "`pip install --no-deps sglang==0.5.23` plus its CPU import deps")

from harness.case import Batch, Case, Request
from harness.contracts.source import check_class, check_classes
from harness.device import make_device
from harness.strategies import with_dims
from harness.triage.static import triage_classes

ASSIGNMENT = re.compile(r"^\s*self\.token_to_kv_pool(:[^=]+)? = .*\n", re.MULTILINE)


@pytest.fixture(scope="module")
def api():
    from harness.sglang_target.api import load_api

    return load_api()


def test_the_real_backend_metadata_and_runners_are_quiet(api, harness_device):
    from harness.sglang_target import SglangTarget

    target = SglangTarget()
    case = with_dims(Case(batches=(Batch(requests=(Request(3, 5),)),)), tuple(target.fixed_dims.items()))
    session = target.open(case, make_device(harness_device))
    classes = triage_classes(session)
    names = {c.__name__ for c in classes}
    assert {"DeepseekV4AttnBackend", "DSV4Metadata", "DSV4AttnMetadata", "SparsePrefillChunkCache",
            "PrefillCudaGraphRunner", "EagerRunner"} <= names
    reports = check_classes(classes)
    assert [(r.cls, r.breaks, r.open) for r in reports if r.breaks or r.open] == []
    backend = next(r for r in reports if r.cls == "DeepseekV4AttnBackend")
    assert backend.hooks and all(re.search("trtllm|mega", h.attribute) for h in backend.hooks)
    assert all(h.subclass in ("DeepseekV4TrtllmAttnBackend", "DeepseekV4MegaAttnBackend") for h in backend.hooks)


@pytest.fixture
def planted_module(api, tmp_path):
    """The real attention package's modules copied; in the copy of deepseek_v4_backend.py the
    `self.token_to_kv_pool = ...` line of __init__ is gone. The copy is imported under a new name."""
    real = Path(api.mods["backend"].__file__)
    for source in real.parent.glob("*.py"):
        shutil.copy(source, tmp_path / source.name)
    path = tmp_path / real.name
    text = path.read_text()
    assert len(ASSIGNMENT.findall(text)) == 1, "the backend's token_to_kv_pool assignment is not one line"
    path.write_text(ASSIGNMENT.sub("", text))
    name = "sglang.srt.layers.attention._planted_deepseek_v4_backend"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    yield module, path
    sys.modules.pop(name, None)


def test_the_planted_break_in_a_copy_of_the_real_backend(planted_module):
    module, path = planted_module
    report = check_class(module.DeepseekV4AttnBackend)
    assert report.open == []
    assert [b.attribute for b in report.breaks] == ["token_to_kv_pool"]
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines, 1) if line.startswith("class DeepseekV4AttnBackend("))
    first_read = next(i for i, line in enumerate(lines[start:], start + 1) if "self.token_to_kv_pool" in line)
    b = report.breaks[0]
    assert (b.method, b.file, b.line) == ("DeepseekV4AttnBackend.__init__", str(path), first_read)
    assert {h.attribute for h in report.hooks} == {h.attribute for h in check_class(
        sys.modules["sglang.srt.layers.attention.deepseek_v4_backend"].DeepseekV4AttnBackend).hooks}


def test_static_only_triage_imports_the_modules_by_name(api, tmp_path, capsys):
    from harness.cli import main

    assert main(["triage", "--target", "sglang", "--static-only", "--report-dir", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "triage.json").read_text())
    assert report["target"] == f"sglang-{api.version}" and report["static_only"]
    assert report["static_breaks"] == [] and report["static_unknowable"] == []
    assert "DeepseekV4AttnBackend" in report["static_classes"] and report["static_missing_modules"] == []
    assert "0 static break(s)" in capsys.readouterr().out
