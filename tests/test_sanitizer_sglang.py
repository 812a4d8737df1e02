"""`sanitize --target sglang`: SGLang's own DSV4 prefill kernels as the sanitizer's cases run them, here on
the CPU (Triton interpreted) or the GPU; under compute-sanitizer they run on a GPU (`sanitize --target sglang`).

Needs sglang 0.5.23 and its CPU import deps; skipped without them.
"""

from __future__ import annotations

import importlib.util

import pytest

from harness.sglang_target.api import prepare_triton

if importlib.util.find_spec("sglang") is None:  # asked before prepare_triton touches this process's Triton
    pytest.skip("the sglang package is not installed: SGLang's kernels need `pip install --no-deps "
                "sglang==0.5.23` plus its CPU import deps", allow_module_level=True)
prepare_triton()  # before sglang imports triton: its kernels interpreted on a machine without a GPU

import torch  # noqa: E402

from harness.errors import EnvironmentBroken  # noqa: E402
from harness.sanitizer import sglang_cases  # noqa: E402
from harness.sanitizer.cases import CASES, cases_of  # noqa: E402
from harness.sanitizer.runner import replay_command  # noqa: E402

# Triton interprets on a machine without a GPU and compiles where one is visible: the kernels' tensors follow.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_sglangs_kernels_run_and_agree_with_their_specification():
    seen = sglang_cases.run_kernels(sglang_cases.kernel_module(), graph=False, device=DEVICE)
    assert seen == list(sglang_cases.SGLANG_KERNELS)


@pytest.mark.gpu
def test_sglangs_kernels_captured_and_replayed_over_new_inputs_agree_with_their_specification():
    seen = sglang_cases.run_kernels(sglang_cases.kernel_module(), graph=True, device="cuda")
    assert seen == list(sglang_cases.SGLANG_KERNELS)


def test_the_specification_check_fires_on_a_wrong_kernel():
    wrong = sglang_cases.edited_module(
        "wrong-lengths", "    tl.store(combined_lens_ptr + token, topk_len + swa_len, mask=valid)\n",
        "    tl.store(combined_lens_ptr + token, topk_len + swa_len + 1, mask=valid)\n")
    with pytest.raises(AssertionError, match=r"combine_topk_swa_indices \(positional SWA\) lengths differs"):
        sglang_cases.run_kernels(wrong, graph=False, device=DEVICE, geometries=("small",))


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_a_whole_case_through_the_real_sglang_path_reaches_both_kernels(graph):
    assert sglang_cases.run_prefill(graph=graph, device=DEVICE) == list(sglang_cases.SGLANG_KERNELS)


@pytest.mark.parametrize("name", sglang_cases.PLANTED_EDITS)
def test_each_planted_edit_applies_to_one_place_in_the_installed_kernels(name):
    old, new = sglang_cases.PLANTED_EDITS[name][3]
    edited = sglang_cases.edited_source(name, old, new)
    assert new in edited and old not in edited


def test_an_edit_that_no_longer_matches_is_an_error_not_a_pass():
    with pytest.raises(EnvironmentBroken, match="matches 0 place"):
        sglang_cases.edited_source("stale", "no such line\n", "")


def test_the_target_runs_its_own_cases_then_the_tools_controls():
    names = [c.name for c in cases_of("sglang")]
    assert names[:6] == ["sglang-kernels-eager", "sglang-prefill-eager", "sglang-kernels-graph",
                         "sglang-prefill-graph", "sglang-planted-oob", "sglang-planted-uninit"]
    assert "planted-race" in names and "attention-eager-t5" not in names
    assert replay_command("memcheck", CASES["sglang-planted-oob"]) == \
        "python -m harness sanitize --target sglang --tool memcheck sglang-planted-oob"
