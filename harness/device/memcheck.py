"""The simulator's memcheck: every load, store and atomic of a Triton kernel that Triton's interpreter runs on the
CPU is checked against the memory its launch was handed, before it touches memory.

On a GPU an access outside every allocation is compute-sanitizer's `memcheck` finding (or an illegal-address fault,
or silent corruption). Interpreted, a kernel's pointers are raw host addresses into the storages of its tensor
arguments, and nothing checks them: a store past the end of its buffer writes into the Python process's heap, and
the process dies later, elsewhere (glibc's "corrupted size vs. prev_size", SIGABRT), with no finding, no report and
no replay line. Here each access's bytes must lie within the storage of one of the launch's tensor arguments (what
the caller handed the kernel); one that does not raises `OutOfBounds` naming the kernel, the access and the nearest
argument, from inside the kernel, so the caller sees an ordinary exception (the interpreter wraps it in its
`InterpreterError`) and the write never happens.

`install(interpreter)` patches Triton's interpreter module in place, once: its grid executor records the launch's
argument storages, its builder's memory operations check against them. Nothing else of the interpreter changes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np


class OutOfBounds(RuntimeError):
    """An interpreted Triton kernel's access outside the storages of its launch's tensor arguments."""


@dataclass(frozen=True)
class Region:
    """A tensor argument's storage: host bytes [start, end)."""

    name: str
    start: int
    end: int


class LaunchRegions:
    """The storages one launch was handed, by start address; the kernel's name for the message."""

    def __init__(self, kernel: str, regions: list[Region]):
        self.kernel = kernel
        self.regions = sorted(regions, key=lambda r: r.start)
        self.starts = np.array([r.start for r in self.regions], dtype=np.uint64)
        self.ends = np.array([r.end for r in self.regions], dtype=np.uint64)

    def check(self, access: str, addresses: np.ndarray, mask: np.ndarray | None, itemsize: int) -> None:
        """Raise `OutOfBounds` where an active address's `itemsize` bytes are not within one region."""
        addresses = np.asarray(addresses, dtype=np.uint64).reshape(-1)
        if mask is not None:
            addresses = addresses[np.asarray(mask, dtype=bool).reshape(-1)]
        if addresses.size == 0:
            return
        owner = np.searchsorted(self.starts, addresses, side="right").astype(np.int64) - 1
        inside = owner >= 0
        inside[inside] &= addresses[inside] + np.uint64(itemsize) <= self.ends[owner[inside]]
        if inside.all():
            return
        outside = addresses[~inside]
        raise OutOfBounds(f"out-of-bounds {access} by Triton kernel {self.kernel} (interpreted): {outside.size} of "
                          f"{addresses.size} address(es) outside every tensor argument's storage; "
                          f"{self._nearest(int(outside[0]), itemsize)}")

    def _nearest(self, address: int, itemsize: int) -> str:
        """Where the first stray address lies against the arguments' storages, for the message."""
        if not self.regions:
            return "the launch has no tensor argument"
        at = int(np.searchsorted(self.starts, np.uint64(address), side="right")) - 1
        if at >= 0 and address >= self.regions[at].start:
            region = self.regions[at]
            return (f"{address + itemsize - region.end} byte(s) past the end of argument {region.name!r} "
                    f"({region.end - region.start} bytes)")
        region = self.regions[0]
        return f"{region.start - address} byte(s) before argument {region.name!r}"


_IN_FLIGHT: list = []  # the grid executors running, innermost last, each with the regions of its launch


def _regions(arg_names, args, kwargs) -> list[Region]:
    """The storage of every tensor argument (a tuple's tensors too), by the kernel's parameter names."""
    named = list(zip(arg_names, args)) + list(kwargs.items())
    regions = []
    for name, value in named:
        for i, tensor in enumerate(value if isinstance(value, tuple) else (value,)):
            if hasattr(tensor, "untyped_storage"):
                storage = tensor.untyped_storage()
                label = f"{name}[{i}]" if isinstance(value, tuple) else name
                regions.append(Region(label, storage.data_ptr(), storage.data_ptr() + storage.nbytes()))
    return regions


def _check(access: str, ptrs, mask, itemsize: int) -> None:
    if _IN_FLIGHT:
        _IN_FLIGHT[-1].harness_regions.check(access, ptrs.data, None if mask is None else mask.data, itemsize)


def _checked_memory_ops(builder, np_dtype_of) -> None:
    """The builder's loads, stores and atomics, each checked against the launch in flight first."""
    load, store = builder.create_masked_load, builder.create_masked_store
    rmw, cas = builder.create_atomic_rmw, builder.create_atomic_cas

    def masked_load(ptrs, mask, other, *args):
        _check("load", ptrs, mask, np_dtype_of(ptrs.get_element_ty()).itemsize)
        return load(ptrs, mask, other, *args)

    def masked_store(ptrs, value, mask, *args):
        _check("store", ptrs, mask, value.data.dtype.itemsize)
        return store(ptrs, value, mask, *args)

    def atomic_rmw(op, ptr, val, mask, *args):
        _check("atomic", ptr, mask, val.data.dtype.itemsize)
        return rmw(op, ptr, val, mask, *args)

    def atomic_cas(ptr, cmp, val, *args):
        _check("atomic", ptr, None, val.data.dtype.itemsize)
        return cas(ptr, cmp, val, *args)

    builder.create_masked_load, builder.create_masked_store = masked_load, masked_store
    builder.create_atomic_rmw, builder.create_atomic_cas = atomic_rmw, atomic_cas


_HOOKS = ("GridExecutor._init_args_hst", "GridExecutor.__call__", "interpreter_builder.create_masked_load",
          "interpreter_builder.create_masked_store", "interpreter_builder.create_atomic_rmw",
          "interpreter_builder.create_atomic_cas", "_get_np_dtype")


def install(interpreter) -> None:
    """Patch `triton.runtime.interpreter` (given) in place; a second call changes nothing. An interpreter without the
    hooks this needs (another Triton) is refused by name: the simulator does not run unchecked."""
    missing = [hook for hook in _HOOKS if not _has(interpreter, hook)]
    if missing:
        raise RuntimeError(f"the simulator's memcheck cannot hook this Triton's interpreter: it lacks {', '.join(missing)}")
    executor = interpreter.GridExecutor
    if getattr(executor, "harness_memcheck", False):
        return
    init_args, run = executor._init_args_hst, executor.__call__

    @functools.wraps(init_args)
    def init_args_recorded(self, args_dev, kwargs):
        args_hst, kwargs_hst = init_args(self, args_dev, kwargs)
        self.harness_regions = LaunchRegions(getattr(self.fn, "__name__", repr(self.fn)),
                                             _regions(self.arg_names, args_hst, kwargs_hst))
        return args_hst, kwargs_hst

    @functools.wraps(run)
    def run_checked(self, *args, **kwargs):
        self.harness_regions = LaunchRegions(getattr(self.fn, "__name__", repr(self.fn)), [])
        _IN_FLIGHT.append(self)
        try:
            return run(self, *args, **kwargs)
        finally:
            _IN_FLIGHT.pop()

    executor._init_args_hst, executor.__call__ = init_args_recorded, run_checked
    _checked_memory_ops(interpreter.interpreter_builder, interpreter._get_np_dtype)
    executor.harness_memcheck = True


def _has(module, dotted: str) -> bool:
    owner = module
    for part in dotted.split("."):
        if not hasattr(owner, part):
            return False
        owner = getattr(owner, part)
    return True


__all__ = ["LaunchRegions", "OutOfBounds", "Region", "install"]
