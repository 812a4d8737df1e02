"""Triton kernels, which bypass the dispatcher: what a kernel's source does through each pointer.

A kernel's tensor arguments are raw pointers to the kernel: no schema says which it writes. Its source
does: a pointer it only `tl.load`s from is read, one it `tl.store`s or `tl.atomic_*`s to is written,
one the source does not tell about (passed on to a helper) is both.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from typing import Optional


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
