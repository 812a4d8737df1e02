"""The dispatch mode: every aten op, on its way to its kernel, is reported before it runs.

CSAN's `CUDASanitizerDispatchMode` (`torch/cuda/_sanitizer.py`), reporting to a callback (the
observer's) instead of keeping state of its own. Entered as a context manager, it is popped off torch's
mode stack when the block ends, also when the block raises.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten


class ObservingMode(TorchDispatchMode):
    """Calls `on_op(func, args, kwargs)` for every op but `record_stream`, then runs the op."""

    def __init__(self, on_op: Callable[[object, tuple, dict], None]):
        super().__init__()
        self.on_op = on_op

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """No Dynamo guard around `__torch_dispatch__`: the harness never compiles, and the guard's
        wrapper costs a few microseconds on every op, which on the simulator's small ops is most of them."""
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not aten.record_stream.default:  # not a kernel, as CSAN skips it
            self.on_op(func, args, kwargs)
        return func(*args, **kwargs)
