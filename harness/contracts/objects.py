"""Regression triage: interface contracts checked on the objects as built, with the reading line.

For each entry point the runners and the scheduler call on a backend (and the methods it calls on
`self`, transitively, read from the source), every `self.<attr>` it reads must exist on the object
as built. A break names the class, the attribute, the call path that reads it and the file and line:
the report the `'DeepseekV4AttnBackend' object has no attribute 'token_to_kv_pool'` CI break after
PR #35947 should have produced.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections import deque
from dataclasses import dataclass
from typing import Iterable

# What the runners and the scheduler call on an attention backend (eager and prefill-graph runners,
# the publisher); everything else is reached through them.
ENTRY_POINTS = ("init_forward_metadata", "resolve_prefill_shared_read_ends", "prepare_prefill_shared_read_snapshot",
                "shared_read_ends", "forward_layers")


@dataclass(frozen=True)
class Break:
    cls: str
    attribute: str
    call_path: tuple[str, ...]
    file: str
    line: int

    def __str__(self) -> str:
        return (f"{self.cls}.{self.attribute} is missing on the object as built; read by "
                f"{' -> '.join(self.call_path)} at {self.file}:{self.line}")


def _self_reads(func) -> tuple[list[tuple[str, int]], list[str], str]:
    """(`self.<attr>` loads with their lines, methods called on self, the file)."""
    try:
        source, first = inspect.getsourcelines(func)
        file = inspect.getsourcefile(func) or "?"
    except (OSError, TypeError):
        return [], [], "?"
    tree = ast.parse(textwrap.dedent("".join(source)))
    reads, calls = [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            if isinstance(node.ctx, ast.Load):
                reads.append((node.attr, first + node.lineno - 1))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "self"):
            calls.append(node.func.attr)
    return reads, calls, file


def _walk_self_calls(cls: type, entry_points: Iterable[str], analyse):
    """The methods of `cls` the entry points reach through calls on self, shortest call path first: yields
    (call path, reads, file) with `analyse(func)`'s (reads, calls, file) for each method once."""
    seen: set[str] = set()
    queue = deque((name, (name,)) for name in entry_points if hasattr(cls, name))
    while queue:
        name, path = queue.popleft()
        if name in seen:
            continue
        seen.add(name)
        func = inspect.getattr_static(cls, name, None)
        if isinstance(func, (staticmethod, classmethod)):
            func = func.__func__
        if not inspect.isfunction(func):  # a class or a value held in an attribute: not a method
            continue
        reads, calls, file = analyse(func)
        yield path, reads, file
        queue.extend((callee, path + (callee,)) for callee in calls if hasattr(cls, callee))


def check_object(obj, entry_points: Iterable[str] = ENTRY_POINTS) -> list[Break]:
    """Every attribute the entry points (and what they call on self) read must exist on `obj`."""
    cls = type(obj)
    breaks: list[Break] = []
    for path, reads, file in _walk_self_calls(cls, entry_points, _self_reads):
        for attr, line in reads:
            if not _has(obj, attr) and not any(b.attribute == attr for b in breaks):
                breaks.append(Break(cls.__name__, attr, path, short_path(file), line))
    return breaks


@dataclass(frozen=True)
class Read:
    """An attribute an entry point reads on every call, whatever its arguments."""

    attribute: str
    call_path: tuple[str, ...]
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.attribute}, read by {' -> '.join(self.call_path)} at {self.file}:{self.line}"


def _unconditional(func) -> tuple[list[tuple[str, int]], list[str], str]:
    """The `self.<attr>` loads and the methods called on self that `func` evaluates on every call: its body up to
    the first statement that may leave it early (a branch holding a return or a raise, a loop, a try), with the
    branches' tests but not their bodies, and only the first operand of `and` / `or` and the test of `x if t else
    y` (the rest is evaluated on some calls only)."""
    try:
        source, first = inspect.getsourcelines(func)
        file = inspect.getsourcefile(func) or "?"
    except (OSError, TypeError):
        return [], [], "?"
    [definition] = ast.parse(textwrap.dedent("".join(source))).body
    reads: list[tuple[str, int]] = []
    calls: list[str] = []

    def take(node) -> None:
        if isinstance(node, ast.BoolOp):
            take(node.values[0])
            return
        if isinstance(node, ast.IfExp):
            take(node.test)
            return
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            return
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
                and isinstance(node.ctx, ast.Load)):
            reads.append((node.attr, first + node.lineno - 1))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "self"):
            calls.append(node.func.attr)
        for child in ast.iter_child_nodes(node):
            take(child)

    for statement in definition.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(statement, (ast.If, ast.While)):
            take(statement.test)
            if any(isinstance(n, (ast.Return, ast.Raise, ast.Break, ast.Continue)) for n in ast.walk(statement)):
                break
            continue
        if isinstance(statement, (ast.For, ast.AsyncFor)):
            take(statement.iter)
            break
        if isinstance(statement, (ast.With, ast.AsyncWith)):
            for item in statement.items:
                take(item.context_expr)
            break
        if isinstance(statement, (ast.Try, ast.Match)):
            break
        take(statement)
        if isinstance(statement, (ast.Return, ast.Raise)):
            break
    return reads, calls, file


def reads_on_every_call(cls: type, entry: str) -> list[Read]:
    """The instance attributes `cls.entry` reads on every call, through the methods it always calls on self:
    what an object built without `__init__` (as SGLang's own unit tests build a backend) must be given before
    the entry point can run at all. Class attributes, methods and properties are not counted."""
    found: list[Read] = []
    for path, reads, file in _walk_self_calls(cls, (entry,), _unconditional):
        for attr, line in reads:
            if not hasattr(cls, attr) and not any(r.attribute == attr for r in found):
                found.append(Read(attr, path, short_path(file), line))
    return found


def _has(obj, attr: str) -> bool:
    try:
        object.__getattribute__(obj, attr)
        return True
    except AttributeError:
        return hasattr(type(obj), attr)


def short_path(file: str) -> str:
    for root in ("site-packages/", "/harness/"):
        if root in file:
            return file.split(root, 1)[1] if root == "site-packages/" else "harness/" + file.split(root, 1)[1]
    return file
