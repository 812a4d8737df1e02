"""The observer: what the system under test really reads and writes, fed to the happens-before tracker.

The tracker judges accesses. Declared ones (``device.launch(op, fn, reads=..., writes=...)``) are the
harness's picture of what the code touches; a read nobody declared would be invisible to it. The
observer watches the code instead, the way PyTorch's CUDA sanitizer does (``torch/cuda/_sanitizer.py``):

- every aten op passes through a ``TorchDispatchMode``; the op's schema says which arguments it
  writes (``alias_info.is_write``: in-place ``self``, ``out=``), which it only views (metadata) and
  which it reads; a tensor argument is mapped to a named buffer by its data pointer range, as CSAN
  keys its state by data pointer;
- a Triton kernel bypasses the dispatcher, so its launcher is wrapped while an observation lasts
  (Triton's own ``launch_enter_hook`` is not called by the interpreter that runs kernels on the CPU),
  and put back when it ends, also by an exception: every tensor argument is an access, a write when
  the kernel's source stores or atomically updates through that pointer, a read when it only loads,
  both when the source cannot tell;
- the access is attributed to the operation the device is running (the launch's stream and place in
  the program) or, for an op the host runs outside any launch, to the device's current stream (the
  real current CUDA stream on a GPU), and carries the Python frame that issued it.

Regions: an op that indexes a registered table through an index tensor the host can read
(``index``/``index_put_``/``index_select``/``index_fill_``/``index_copy_``/``index_add_`` along dim 0,
index on the CPU) touches those rows; any other op touches the rows its tensor's span covers (a view
of rows gives those rows; anything reaching across rows, or an index on the GPU, which could only be
read with a host sync, gives the span). A buffer's rows are its dim-0 entries: rows of
``req_to_token``, slots of Full-to-SWA, the mapping and the KV pools, as the declarations name them.
Where the rows cannot be seen (an index on the GPU or a mask, a Triton pointer the kernel offsets
itself) only the buffer is known: the launch must declare that buffer, and its declared rows are
what the tracker judges; undeclared, the whole buffer is.

Declared accesses remain (the harness stands in for parts of the system), but they are checked: an
observed access to a shared buffer that the running launch did not declare, or declared narrower,
is an `UndeclaredAccess`, a finding of its own, so a wrong declaration can never hide a race.

One job a module, as CSAN separates argument handling, event handling and the dispatch mode:
`schema` (which arguments an op reads and writes), `regions` (which rows a tensor reaches),
`declarations` (an access against its launch's declaration), `frames` (the issuing frame), `triton`
(a kernel's source, and its launchers), `dispatch` (the dispatch mode) and `observer`, which brings
them together.
"""

from __future__ import annotations

from harness.observe.declarations import UndeclaredAccess
from harness.observe.frames import issuing_frame
from harness.observe.observer import BATCH_FIELDS, Observer, default_buffers
from harness.observe.triton import kernel_access_kinds

__all__ = ["BATCH_FIELDS", "Observer", "UndeclaredAccess", "default_buffers", "issuing_frame", "kernel_access_kinds"]
