"""Triton kernels, which bypass the dispatcher: what a kernel's source does through each pointer, and
its launchers wrapped while an observer watches.

A kernel's tensor arguments are raw pointers to the kernel: no schema says which it writes. Its source
does: a pointer it only `tl.load`s from is read, one it `tl.store`s or `tl.atomic_*`s to is written,
one the source does not tell about (passed on to a helper) is both.

Triton's own `launch_enter_hook` is not called by the interpreter that runs kernels on the CPU, so the
launchers themselves (`JITFunction.run`, `InterpretedFunction.run`) are wrapped, for as long as some
observation lasts and no longer: outside one, the process's Triton is as the observer found it.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import textwrap
from typing import ContextManager, Iterator, Optional, Protocol


class LaunchObserver(Protocol):
    """What the wrapped launchers report to (`harness.observe.observer.Observer`)."""

    def on_launch(self, kernel, args: tuple, kwargs: dict) -> None: ...

    def suspended(self) -> ContextManager[None]: ...


_ACTIVE: Optional[LaunchObserver] = None  # the innermost observation's; the launchers are wrapped while there is one


@functools.cache
def kernel_access_kinds(fn) -> dict[str, tuple[bool, bool]]:
    """For each parameter of a Triton kernel: (loads through it, stores through it), from its source.

    A pointer reaches `tl.load`/`tl.store`/`tl.atomic_*` through local arithmetic (`q_ptr + offs`), so
    each local name carries the parameters it was computed from. A parameter the source never loads
    or stores through (passed on to a helper, say) is reported as both: unknown is read and write.
    """
    definition = _definition(fn)
    if definition is None:
        return {}
    params = [a.arg for a in definition.args.args + definition.args.kwonlyargs]
    origins = _pointer_origins(definition, params)
    loads, stores = _loads_and_stores(definition, origins)
    return {p: (p in loads, p in stores) if p in loads or p in stores else (True, True) for p in params}


def _definition(fn) -> Optional[ast.FunctionDef]:
    """The kernel's `def`, parsed from its source; None where the source cannot be read or parsed."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return None
    return next((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)


def _reached(node, origins: dict[str, set[str]]) -> set[str]:
    """The parameters an expression was computed from."""
    found: set[str] = set()
    for name in ast.walk(node):
        if isinstance(name, ast.Name):
            found |= origins.get(name.id, set())
    return found


def _pointer_origins(definition: ast.FunctionDef, params: list[str]) -> dict[str, set[str]]:
    """For each name in the kernel, the parameters it was computed from, to a fixpoint: loops carry
    pointers from one iteration to the next."""
    origins: dict[str, set[str]] = {p: {p} for p in params}
    changed = True
    while changed:
        changed = False
        for node in ast.walk(definition):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                sources = _reached(node.value, origins)
                for target in targets:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name):
                            before = origins.setdefault(name.id, set())
                            if not sources <= before:
                                before |= sources
                                changed = True
    return origins


def _loads_and_stores(definition: ast.FunctionDef, origins: dict[str, set[str]]) -> tuple[set[str], set[str]]:
    """The parameters the kernel loads through and those it stores through (an atomic does both)."""
    loads: set[str] = set()
    stores: set[str] = set()
    for node in ast.walk(definition):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            op = node.func.attr
            pointer = node.args[0]
            if op == "load":
                loads |= _reached(pointer, origins)
            elif op == "store" or op.startswith("atomic_"):
                stores |= _reached(pointer, origins)
                if op.startswith("atomic_"):
                    loads |= _reached(pointer, origins)
    return loads, stores


# -- the launchers, wrapped for the length of an observation --------------------------------------------

@contextlib.contextmanager
def launches_reported_to(observer: LaunchObserver) -> Iterator[None]:
    """Triton launches in the block are reported to `observer`, the innermost one where observations
    nest. The outermost observation wraps the launchers and puts back the very functions it found when
    it ends, also when the block raises."""
    global _ACTIVE
    previous, _ACTIVE = _ACTIVE, observer
    try:
        with (_launchers_wrapped() if previous is None else contextlib.nullcontext()):
            yield
    finally:
        _ACTIVE = previous


@functools.cache
def _launcher_classes() -> tuple[type, ...]:
    """The compiled and the interpreted launcher; none where Triton is not installed (looked for once:
    a failed import searches the whole path again every time)."""
    try:
        from triton.runtime import interpreter, jit  # optional: only where Triton is installed
    except ImportError:
        return ()
    return jit.JITFunction, interpreter.InterpretedFunction


@contextlib.contextmanager
def _launchers_wrapped() -> Iterator[None]:
    """Each launcher class's `run` wrapped for the block, the original restored after it."""
    originals = [(cls, cls.run) for cls in _launcher_classes()]
    for cls, run in originals:
        cls.run = _observed_run(run)
    try:
        yield
    finally:
        for cls, run in originals:
            cls.run = run


def _observed_run(run):
    """`run` that reports each launch to the active observer first. The observer is suspended while
    the launch runs: the interpreter's own copies of the arguments are not the kernel's accesses."""

    @functools.wraps(run)
    def observed(kernel, *args, grid, warmup=False, **kwargs):
        observer = _ACTIVE
        if observer is None or warmup:  # None: a launcher bound during an observation, called after it
            return run(kernel, *args, grid=grid, warmup=warmup, **kwargs)
        observer.on_launch(kernel, args, kwargs)
        with observer.suspended():
            return run(kernel, *args, grid=grid, warmup=warmup, **kwargs)

    return observed
