"""`harness/device/memcheck.py`: an interpreted Triton kernel's load or store outside its launch's tensor arguments
is refused before it touches memory, naming the kernel and the argument; in-bounds and masked-off lanes run as
before. The case that needed it: a regression that made SGLang 0.5.19's chunk-cache build plan fewer query rows than
its Triton combine kernel writes corrupted the campaign's heap (SIGABRT, no report) instead of being a finding.

Needs triton, interpreted (CI: the sglang environment); skipped otherwise.
"""

from __future__ import annotations

from harness.sglang_target.api import prepare_triton

prepare_triton()

import os  # noqa: E402

import pytest  # noqa: E402

triton = pytest.importorskip("triton", reason="the memcheck hooks Triton's interpreter: triton is not installed")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("the memcheck hooks Triton's interpreter, which runs kernels on the CPU only (a GPU is visible)",
                allow_module_level=True)

import torch  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

from harness.device import memcheck  # noqa: E402

memcheck.install(interpreter)


@triton.jit
def _shifted_copy(src_ptr, dst_ptr, n, shift, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst_ptr + offs + shift, tl.load(src_ptr + offs, mask=mask), mask=mask)


@triton.jit
def _gather(src_ptr, idx_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + tl.load(idx_ptr + offs, mask=mask), mask=mask), mask=mask)


def test_in_bounds_and_masked_off_lanes_run_as_before():
    src, dst = torch.arange(8, dtype=torch.int32), torch.zeros(8, dtype=torch.int32)
    _shifted_copy[(1,)](src, dst, 5, 3, BLOCK=16)  # lanes 5..15 would be past dst's end: masked off, unchecked
    assert dst.tolist() == [0, 0, 0, 0, 1, 2, 3, 4]


def test_a_store_past_the_end_is_refused_before_it_writes():
    src, dst = torch.arange(8, dtype=torch.int32), torch.zeros(8, dtype=torch.int32)
    with pytest.raises(Exception, match=r"out-of-bounds store by Triton kernel _shifted_copy \(interpreted\): 2 of 8 "
                                        r"address\(es\) .* 4 byte\(s\) past the end of argument 'dst_ptr' \(32 bytes\)"):
        _shifted_copy[(1,)](src, dst, 8, 2, BLOCK=8)
    assert dst.tolist() == [0] * 8  # the store was refused whole: nothing written, the heap untouched


def test_a_load_far_outside_every_argument_is_refused():
    src, dst = torch.arange(8, dtype=torch.float32), torch.zeros(4, dtype=torch.float32)
    idx = torch.tensor([0, 7, -(1 << 40), 3], dtype=torch.int64)
    with pytest.raises(Exception, match=r"out-of-bounds load by Triton kernel _gather .* 1 of 4 address\(es\)"):
        _gather[(1,)](src, idx, dst, 4, BLOCK=4)
    _gather[(1,)](src, torch.tensor([0, 7, 2, 3]), dst, 4, BLOCK=4)
    assert dst.tolist() == [0.0, 7.0, 2.0, 3.0]


def test_install_is_idempotent_and_refuses_an_interpreter_without_its_hooks():
    memcheck.install(interpreter)  # the second call changes nothing (the executor is patched once)
    with pytest.raises(RuntimeError, match="cannot hook this Triton's interpreter: it lacks GridExecutor"):
        memcheck.install(type("Interpreter", (), {})())
