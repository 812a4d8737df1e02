"""The recording stand-in for a compiled extension SGLang imports but that cannot be loaded here
(`harness/sglang_target/api.py`): imported where it is missing, never where it loads; a call is
recorded with its caller and raises the BROKEN error; a swallowed call is still found after the case."""

from __future__ import annotations

import importlib
import sys

import pytest

from harness.errors import EnvironmentBroken
from harness.sglang_target.api import StandIns, StandInUsed

MISSING = "harness_test_missing_extension"


@pytest.fixture
def stand_ins():
    found = StandIns()
    found.stand_in_unloadable([MISSING, "json"])
    yield found
    sys.meta_path.remove(found)
    for name in [m for m in sys.modules if m.split(".")[0] == MISSING]:
        del sys.modules[name]


def test_only_the_module_that_cannot_load_is_stood_in(stand_ins):
    assert list(stand_ins.reasons) == [MISSING] and "ModuleNotFoundError" in stand_ins.reasons[MISSING]
    assert importlib.import_module("json").__file__  # a loadable module is the real one
    ops = importlib.import_module(f"{MISSING}.ops")  # submodules are stand-ins too
    assert ops.__name__ == f"{MISSING}.ops"
    [row] = stand_ins.describe()
    assert row["module"] == MISSING and any("test_stand_ins.py" in line for line in row["imported_by"])


def test_a_call_is_broken_and_names_the_function_and_the_calling_line(stand_ins):
    ext = importlib.import_module(MISSING)
    kernel = ext.ops.fused_kernel  # attribute access at import time is allowed
    with pytest.raises(StandInUsed) as info:
        kernel(1, 2)
    assert isinstance(info.value, EnvironmentBroken) and info.value.exit_code == 3
    message = str(info.value)
    assert f"{MISSING}.ops.fused_kernel()" in message
    assert "test_a_call_is_broken_and_names_the_function_and_the_calling_line at test_stand_ins.py:" in message


def test_a_swallowed_call_is_still_found_after_the_case(stand_ins):
    ext = importlib.import_module(MISSING)
    before = len(stand_ins.uses)
    stand_ins.check_unused(before)  # nothing called yet: quiet
    try:
        ext.helper()
    except Exception:  # noqa: BLE001 - the system under test swallowing the error
        pass
    with pytest.raises(StandInUsed, match=f"{MISSING}.helper"):
        stand_ins.check_unused(before)
