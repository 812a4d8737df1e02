"""The issuing frame: `file:line in function` of the code that made an access, for the finding to name.

A conflict is only actionable where it points at the line that touched the buffer, and that line is
rarely the innermost frame: torch, Triton, the harness's devices, tracker and observer lie between. The
frame wanted is SGLang's own when SGLang is on the stack (the code under test), else the innermost one
outside that machinery.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from typing import Optional

import torch

_HARNESS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_REPO = os.path.dirname(_HARNESS)
_INTERNAL_PREFIXES = (
    os.path.dirname(torch.__file__) + os.sep,
    os.path.join(_HARNESS, "observe") + os.sep, os.path.join(_HARNESS, "device") + os.sep,
    os.path.join(_HARNESS, "hb.py"), os.path.join(_HARNESS, "engine.py"), os.path.join(_HARNESS, "kernels") + os.sep,
    os.path.dirname(contextlib.__file__) + os.sep + "contextlib.py",
    os.path.dirname(functools.__file__) + os.sep + "functools.py",
)
_kinds: dict[str, str] = {}


def _kind_of(filename: str) -> str:
    """`internal` (torch, Triton, the harness's machinery), `sglang`, or `code`; cached per file, as
    every access asks."""
    kind = _kinds.get(filename)
    if kind is None:
        path = os.path.abspath(filename)
        if path.startswith(_INTERNAL_PREFIXES) or f"{os.sep}triton{os.sep}" in path:
            kind = "internal"
        elif f"{os.sep}sglang{os.sep}" in path and f"{os.sep}harness{os.sep}" not in path:
            kind = "sglang"
        else:
            kind = "code"
        _kinds[filename] = kind
    return kind


def issuing_frame() -> Optional[str]:
    """`file:line in function` of the code that issued the current op: SGLang's own frame when SGLang
    is on the stack, else the innermost frame outside torch, Triton and the harness's machinery."""
    frame = sys._getframe(1)
    whole_stack = "sglang" in sys.modules  # only then can an SGLang frame be further out
    first = None
    while frame is not None:
        kind = _kind_of(frame.f_code.co_filename)
        if kind == "sglang":
            return _describe_frame(frame)
        if kind == "code" and first is None:
            first = frame
            if not whole_stack:
                break
        frame = frame.f_back
    return _describe_frame(first) if first is not None else None


def _describe_frame(frame) -> str:
    return f"{_short_path(frame.f_code.co_filename)}:{frame.f_lineno} in {frame.f_code.co_name}"


@functools.cache
def _short_path(filename: str) -> str:
    """A file as a reader finds it: inside its installed package, or inside this repository."""
    path = os.path.abspath(filename)
    if "site-packages" + os.sep in path:
        return path.split("site-packages" + os.sep, 1)[1]
    if path.startswith(_REPO + os.sep):
        return os.path.relpath(path, _REPO)
    return path
