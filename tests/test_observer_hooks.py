"""What the observer hooks into lasts as long as the observation: torch's dispatch mode stack and Triton's
launchers are as the observer found them once `observing()` ends, after an exception too, and nested
observations hand the hooks on instead of stacking or dropping them.

A stand-in launcher class (Triton's `kernel[grid](...)` calling `run` through the class) takes the place of
Triton's where Triton is not installed; the last test checks Triton's own launchers where it is."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from harness.hb import HappensBefore
from harness.observe import Observer
from harness.observe import triton as observe_triton

STREAM = 1001


def stand_in_kernel(x_ptr):
    """The stand-in's source: a pointer it neither loads nor stores through, so it is read and written."""
    return x_ptr


class StandInLauncher:
    """`JITFunction`'s shape: `kernel[grid](*args)` calls `self.run(..., grid=, warmup=False)`."""

    arg_names = ("x_ptr",)
    fn = staticmethod(stand_in_kernel)

    def __init__(self) -> None:
        self.runs = 0

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.run(*args, grid=grid, warmup=False, **kwargs)

    def run(self, *args, grid, warmup, **kwargs):
        self.runs += 1


ORIGINAL_RUN = StandInLauncher.run


class Watched:
    """An observer over its own tracker with one registered tensor, and a way to launch the stand-in on it."""

    def __init__(self) -> None:
        self.hb = HappensBefore()
        self.observer = Observer(self.hb, lambda: STREAM)
        self.x = torch.zeros(4)
        self.observer.register("x", self.x)

    def undeclared_in(self, fn) -> int:
        """Runs `fn` as an op that declares nothing: how many undeclared accesses this observer saw."""
        before = len(self.observer.undeclared)
        record = self.hb.open_launch(STREAM, "op", {}, {})
        self.observer.attributed(record, fn)()
        return len(self.observer.undeclared) - before

    def launch(self, kernel: StandInLauncher) -> int:
        """`kernel` launched on the tensor: two undeclared accesses (read and write) when the launch was
        reported to this observer."""
        return self.undeclared_in(lambda: kernel[(1,)](self.x))


@pytest.fixture
def stand_in(monkeypatch) -> StandInLauncher:
    monkeypatch.setattr(observe_triton, "_launcher_classes", lambda: (StandInLauncher,))
    return StandInLauncher()


def test_the_launcher_is_wrapped_only_while_observing(stand_in):
    watched = Watched()
    assert watched.launch(stand_in) == 0
    with watched.observer.observing():
        assert StandInLauncher.run is not ORIGINAL_RUN
        assert watched.launch(stand_in) == 2
    assert vars(StandInLauncher)["run"] is ORIGINAL_RUN
    assert watched.launch(stand_in) == 0 and stand_in.runs == 3


def test_the_launcher_and_the_dispatch_mode_are_restored_when_the_observed_code_raises(stand_in):
    watched = Watched()
    modes = list(_get_current_dispatch_mode_stack())
    with pytest.raises(RuntimeError, match="in the observed code"):
        with watched.observer.observing():
            assert StandInLauncher.run is not ORIGINAL_RUN
            assert len(_get_current_dispatch_mode_stack()) == len(modes) + 1
            raise RuntimeError("in the observed code")
    assert vars(StandInLauncher)["run"] is ORIGINAL_RUN
    assert list(_get_current_dispatch_mode_stack()) == modes
    assert watched.undeclared_in(lambda: watched.x.add_(1)) == 0  # no longer observed


def test_a_launch_that_raises_leaves_the_observer_observing(stand_in, monkeypatch):
    """The observer is suspended while a launch runs; a launch that raises must not leave it so."""
    watched = Watched()

    def failing_run(self, *args, grid, warmup, **kwargs):
        raise ValueError("the kernel failed")

    monkeypatch.setattr(StandInLauncher, "run", failing_run)
    with watched.observer.observing():
        with pytest.raises(ValueError, match="the kernel failed"):
            stand_in[(1,)](watched.x)
        assert watched.undeclared_in(lambda: watched.x.add_(1)) == 1  # still seen
    assert vars(StandInLauncher)["run"] is failing_run


def test_a_reentered_observation_keeps_the_launcher_wrapped_until_the_outermost_ends(stand_in):
    watched = Watched()
    with watched.observer.observing():
        with watched.observer.observing():
            wrapped = StandInLauncher.run
            assert watched.launch(stand_in) == 2  # reported once, not once per level
        assert StandInLauncher.run is wrapped
        assert watched.launch(stand_in) == 2
    assert vars(StandInLauncher)["run"] is ORIGINAL_RUN


def test_nested_observers_report_launches_to_the_innermost(stand_in):
    outer, inner = Watched(), Watched()
    with outer.observer.observing():
        with inner.observer.observing():
            assert inner.launch(stand_in) == 2
            assert outer.observer.undeclared == []
        assert outer.launch(stand_in) == 2
    assert vars(StandInLauncher)["run"] is ORIGINAL_RUN
    assert len(inner.observer.undeclared) == 2


def test_a_launcher_bound_while_observing_and_called_after_reports_to_no_one(stand_in):
    watched = Watched()
    with watched.observer.observing():
        bound = stand_in.run
    assert watched.undeclared_in(lambda: bound(watched.x, grid=(1,), warmup=False)) == 0
    assert stand_in.runs == 1


def test_triton_s_own_launchers_are_put_back():
    pytest.importorskip("triton", reason="triton is not installed in this environment (the CI venv has none)")
    from triton.runtime import interpreter, jit

    originals = (vars(jit.JITFunction)["run"], vars(interpreter.InterpretedFunction)["run"])
    watched = Watched()
    with pytest.raises(RuntimeError):
        with watched.observer.observing():
            assert (jit.JITFunction.run, interpreter.InterpretedFunction.run) != originals
            raise RuntimeError
    assert (vars(jit.JITFunction)["run"], vars(interpreter.InterpretedFunction)["run"]) == originals
