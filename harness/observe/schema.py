"""The schema rules: which tensor arguments of an aten op it reads and which it writes, and which
argument names the rows of `self` it indexes.

CSAN's argument handling (`torch/cuda/_sanitizer.py`, `ArgumentHandler`): an argument whose schema
alias information says `is_write` (an in-place `self`, `out=`) is written; a view's or a factory's
input has only its metadata read; any other tensor argument is read. Worked out once per op, since
every op of the observed run asks.
"""

from __future__ import annotations

import re
from typing import Iterator, NamedTuple, Optional

import torch

# CSAN's rule: a factory op (`empty_like`, `new_zeros`) reads only the metadata of its tensor argument.
_FACTORY = re.compile("(new_.*|.*_like)")
# Ops whose dim-0 index argument names the rows of `self` they touch: (position of dim, of index).
_INDEXED_ALONG = {"index_select": (1, 2), "index_fill_": (1, 2), "index_copy_": (1, 2), "index_add_": (1, 2),
                  "index_fill": (1, 2), "index_copy": (1, 2), "index_add": (1, 2)}
_INDEXED_BY_LIST = ("index", "index_put_", "index_put", "_index_put_impl_")
_SMALL_INDEX = 64  # up to this many entries the rows are read directly, beyond it through torch.unique

UNREADABLE = object()  # an index whose rows the host cannot read: the rows are unknown, not none


class Plan(NamedTuple):
    """What an op touches: (position, is_write) of its positional tensor arguments, is_write by keyword
    name, and the indexing rule of its `self` (the op's name) if it has one."""

    positional: tuple[tuple[int, bool], ...]
    named: dict[str, bool]
    indexed: Optional[str]
    op: object  # the op itself kept, so its id is never reused


_PLANS: dict[int, Plan] = {}


def plan(func) -> Plan:
    """The op's `Plan`, cached by id: an op's own hash is computed in Python."""
    found = _PLANS.get(id(func))
    if found is None:
        found = _PLANS[id(func)] = _plan(func)
    return found


def _plan(func) -> Plan:
    """The positions and keyword names of the tensor arguments the op reads or writes (a view's or a
    factory's input is metadata only), and the indexing rule of its `self` if it has one."""
    schema = func._schema
    factory = bool(_FACTORY.match(schema.name))
    positional: list[tuple[int, bool]] = []
    named: dict[str, bool] = {}
    for position, argument in enumerate(schema.arguments):
        alias = argument.alias_info
        is_write = alias is not None and alias.is_write
        if not is_write and (factory or alias is not None):
            continue
        if "Tensor" not in str(argument.type):
            continue  # a scalar, a size, a dtype
        if argument.kwarg_only:
            named[argument.name] = is_write
        else:
            positional.append((position, is_write))
            named[argument.name] = is_write  # a positional argument may be passed by keyword too
    name = schema.name.split("::")[-1]
    indexed = name if name in _INDEXED_ALONG or name in _INDEXED_BY_LIST else None
    return Plan(tuple(positional), named, indexed, func)


def tensors(value) -> Iterator[torch.Tensor]:
    """The tensors of an argument: itself, or the tensors of a list of them."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            if isinstance(item, torch.Tensor):
                yield item


def indexed_rows(name: str, args):
    """The dim-0 rows an indexing op touches in its `self` (see `_host_values`)."""
    if name in _INDEXED_ALONG:
        dim_at, index_at = _INDEXED_ALONG[name]
        if len(args) <= index_at or args[dim_at] != 0:
            return None
        return _host_values(args[index_at])
    if name in _INDEXED_BY_LIST and len(args) > 1 and args[1] and isinstance(args[1], (list, tuple)):
        return _host_values(args[1][0])
    return None


def _host_values(index):
    """The rows an index tensor names; `UNREADABLE` for one on the GPU (reading it would need a host
    sync, which closes the race window) or a mask; None where the op indexes no rows of dim 0."""
    if not isinstance(index, torch.Tensor):
        return None
    if not index.is_cpu or index.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8,
                                                         torch.uint8):
        return UNREADABLE
    if index.numel() > _SMALL_INDEX:
        index = torch.unique(index)
    return index.flatten().tolist()
