"""Region arithmetic: which rows of a named buffer a tensor's memory reaches.

The tracker judges rows, not bytes: a buffer's rows are its dim-0 entries (rows of `req_to_token`,
slots of Full-to-SWA, the pools' pages, as the declarations name them), and a region is a set of rows,
or None for the whole buffer (`harness.hb.Region`). A tensor is matched to a buffer by the bytes it
spans, as CSAN keys its state by data pointer, so a view reaches the buffer it was cut from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from harness.hb import Region


@dataclass(frozen=True)
class Registered:
    """A named buffer: the allocation it lives in, the bytes it spans, and how wide one row is."""

    name: str
    storage: int  # the data pointer of the allocation it lives in
    start: int
    end: int
    row_bytes: int
    rows: int
    shared: bool
    tensor: torch.Tensor = field(compare=False, repr=False)  # kept alive: its memory is never reused under the name


def registered(name: str, tensor: torch.Tensor, shared: bool) -> Registered:
    """`tensor` (not empty) as the buffer `name`; a 1-D tensor's rows are its elements."""
    start, end = span(tensor)
    row_bytes = tensor.stride(0) * tensor.element_size() if tensor.dim() > 1 else tensor.element_size()
    storage = tensor.untyped_storage().data_ptr()
    return Registered(name, storage, start, end, max(row_bytes, 1), tensor.shape[0], shared, tensor)


def span(tensor: torch.Tensor) -> tuple[int, int]:
    """The bytes a strided tensor can touch, [first, last + 1) (torch strides are never negative)."""
    size = tensor.element_size()
    start = tensor.data_ptr()
    last = sum((extent - 1) * stride for extent, stride in zip(tensor.shape, tensor.stride()) if extent > 1)
    return start, start + (last + 1) * size


def rows_touched(entry: Registered, tensor: torch.Tensor, start: int, end: int, rows: Optional[list[int]]) -> Region:
    """Rows of `entry` that `tensor` touches: the indexed rows where known, else its span's rows."""
    first = max(start, entry.start) - entry.start
    last = min(end, entry.end) - 1 - entry.start
    if rows is not None and tensor.dim() > 0:
        stride = tensor.stride(0) * tensor.element_size()
        offset = tensor.data_ptr() - entry.start
        if stride % entry.row_bytes == 0 and offset % entry.row_bytes == 0 and 0 <= offset < entry.end - entry.start:
            base, step = offset // entry.row_bytes, stride // entry.row_bytes
            extent = tensor.shape[0]
            return frozenset(base + step * (r % extent if r < 0 else r) for r in rows)
    low, high = first // entry.row_bytes, last // entry.row_bytes + 1
    if low == 0 and high >= entry.rows:
        return None
    return frozenset(range(low, high))
