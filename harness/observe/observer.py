"""The observer itself: registered buffers, attribution to launches, and what one op or launch touched."""

from __future__ import annotations

import contextlib
import functools
from typing import Callable, Iterator, Mapping, Optional

import torch

from harness.errors import InvalidArgument
from harness.hb import HappensBefore, LaunchRecord, covers, union
from harness.observe.declarations import Seen, UndeclaredAccess, against, undeclared
from harness.observe.dispatch import ObservingMode
from harness.observe.frames import issuing_frame
from harness.observe.regions import Registered, registered, rows_touched, span
from harness.observe.schema import UNREADABLE, indexed_rows, plan, tensors
from harness.observe.triton import kernel_access_kinds, launches_reported_to

# The fields of a forward batch that the scheduler shares with the forward (SGLang's per-batch tensors).
BATCH_FIELDS = ("req_pool_indices", "positions", "seq_lens", "extend_seq_lens", "out_cache_loc")
_TABLES = ("req_to_token", "full_to_swa", "full_to_hisparse")


def default_buffers(session) -> dict[str, torch.Tensor]:
    """A session's shared state: the three tables and the KV pools (`kv_state()`), a 3-D pool per layer as
    `name[layer]`."""
    buffers = {name: getattr(session, name) for name in _TABLES if isinstance(getattr(session, name, None), torch.Tensor)}
    for name, pool in session.kv_state().items():
        if pool.dim() == 3:
            buffers.update({f"{name}[{layer}]": pool[layer] for layer in range(pool.shape[0])})
        else:
            buffers[name] = pool
    return buffers


class Observer:
    """Records which registered buffer every op reads and writes, and feeds `tracker`.

    `stream_id()` names the stream an op outside any launch runs on (the device's current stream).
    Turn it on around the code under test with `observing()`; attribute the ops of one launched
    closure with `attributed(record, fn)`.
    """

    def __init__(self, tracker: HappensBefore, stream_id: Callable[[], int]):
        self.tracker = tracker
        self.stream_id = stream_id
        self.undeclared: list[UndeclaredAccess] = []
        self._by_name: dict[str, Registered] = {}
        self._by_storage: dict[int, list[Registered]] = {}  # a tensor can reach only its own storage
        self._record: Optional[LaunchRecord] = None
        self._capture: Optional[tuple[dict, dict, str, Mapping, Mapping]] = None
        self._suspended = 0

    # -- buffers ---------------------------------------------------------------------------------

    def register(self, name: str, tensor: torch.Tensor, *, shared: bool = True) -> None:
        """Name the memory `tensor` spans. Re-registering a name moves it to the new tensor (the next
        batch's per-batch tensors); two names may not share memory. `shared`: the scheduler writes it,
        so an access the op did not declare is a finding."""
        if not isinstance(tensor, torch.Tensor):
            raise InvalidArgument(f"buffer {name!r}: expected a tensor, got {type(tensor).__name__}")
        self.forget(name)
        if tensor.numel() == 0:
            return
        entry = registered(name, tensor, shared)
        entries = self._by_storage.setdefault(entry.storage, [])
        for other in entries:
            if other.start < entry.end and entry.start < other.end:
                raise InvalidArgument(f"buffer {name!r} overlaps the registered buffer {other.name!r}: "
                                      "two names may not share memory")
        entries.append(entry)
        self._by_name[name] = entry

    def forget(self, name: str) -> None:
        entry = self._by_name.pop(name, None)
        if entry is not None:
            entries = self._by_storage[entry.storage]
            entries.remove(entry)
            if not entries:
                del self._by_storage[entry.storage]

    def register_session(self, session) -> None:
        """The protocol's shared state, by the names the declarations use: the session's own
        `observed_buffers()` where it has one (its KV lives in buffers other than `kv_state()`'s), else
        `default_buffers`."""
        buffers = session.observed_buffers() if hasattr(session, "observed_buffers") else default_buffers(session)
        for name, tensor in buffers.items():
            self.register(name, tensor)

    def register_batch(self, fb) -> None:
        """The per-batch tensors of the batch just loaded, as `fb.<field>`."""
        for name in BATCH_FIELDS:
            tensor = getattr(fb, name, None)
            if isinstance(tensor, torch.Tensor):
                self.register(f"fb.{name}", tensor)

    # -- switching on and attributing ---------------------------------------------------------------

    @contextlib.contextmanager
    def observing(self) -> Iterator["Observer"]:
        """Every aten op and Triton launch in the block is observed. Nothing the observer hooks into
        outlives the block: the dispatch mode is popped and Triton's launchers are put back when it
        ends, also when it raises."""
        with launches_reported_to(self), ObservingMode(self.on_op):
            yield self

    def attributed(self, record: LaunchRecord, fn: Callable[[], None]) -> Callable[[], None]:
        """`fn` as the device runs it: its accesses belong to `record`, which closes when it returns."""

        def run() -> None:
            with self.attributing(record):
                fn()

        return run

    @contextlib.contextmanager
    def attributing(self, record: LaunchRecord) -> Iterator[None]:
        """The block's accesses belong to `record` (a launched closure, or host work issued as one
        operation); the record closes when the block ends."""
        previous, self._record = self._record, record
        try:
            yield
        finally:
            self._record = previous
            self.tracker.close_launch(record)

    def collecting(self, op: str, reads: Mapping, writes: Mapping, fn: Callable[[], None],
                   into: tuple[dict, dict]) -> Callable[[], None]:
        """`fn` as a graph capture runs it: what it touches is added to the node's reads and writes
        (`into`), so every replay of the graph carries it; nothing is fed to the tracker now."""

        def run() -> None:
            previous, self._capture = self._capture, (into[0], into[1], op, reads, writes)
            try:
                fn()
            finally:
                self._capture = previous

        return run

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        """Ops in the block are not observed (a Triton interpreter copying its arguments back)."""
        self._suspended += 1
        try:
            yield
        finally:
            self._suspended -= 1

    # -- one op ------------------------------------------------------------------------------------

    def on_op(self, func, args, kwargs) -> None:
        """One aten op (from the dispatch mode): the registered buffers its tensor arguments reach."""
        if self._suspended or not self._by_storage:
            return
        positional, named, indexed, _ = plan(func)
        if not positional and not named:
            return  # no tensor argument it could read or write (a factory)
        accesses: list[Seen] = []
        count = len(args)
        for position, is_write in positional:
            if position < count:
                value = args[position]
                rows = functools.partial(indexed_rows, indexed, args) if position == 0 and indexed else None
                if isinstance(value, torch.Tensor):
                    self._match(value, is_write, rows, accesses)
                elif isinstance(value, (list, tuple)):
                    for tensor in value:
                        if isinstance(tensor, torch.Tensor):
                            self._match(tensor, is_write, rows, accesses)
        if kwargs:
            for name, value in kwargs.items():
                is_write = named.get(name)
                if is_write is not None:
                    for tensor in tensors(value):
                        self._match(tensor, is_write, None, accesses)
        if accesses:
            self._feed(str(func), accesses)

    def on_launch(self, kernel, args, kwargs) -> None:
        """One Triton launch (from the wrapped launcher): the registered buffers its pointers reach."""
        if self._suspended or not self._by_storage:
            return
        kinds = kernel_access_kinds(kernel.fn)
        accesses: list[Seen] = []
        bound = list(zip(kernel.arg_names, args)) + list(kwargs.items())
        for name, value in bound:
            if isinstance(value, torch.Tensor):
                loads, stores = kinds.get(name, (True, True))
                if stores:  # through pointers it computes itself: which rows, only the kernel knows
                    self._match(value, True, None, accesses, exact=False)
                if loads:
                    self._match(value, False, None, accesses, exact=False)
        if accesses:
            self._feed(f"triton:{getattr(kernel.fn, '__name__', 'kernel')}", accesses)

    def _match(self, tensor: torch.Tensor, is_write: bool, rows: Optional[Callable[[], Optional[list[int]]]],
               into: list[Seen], exact: bool = True) -> None:
        """`rows`, for an indexing op's `self`, reads the rows its index names (only once it matters)."""
        entries = self._by_storage.get(tensor.untyped_storage().data_ptr())
        if entries is None or tensor.numel() == 0:
            return
        start, end = span(tensor)
        for entry in entries:
            if entry.start < end and start < entry.end:
                indexed = rows() if rows else None
                if indexed is UNREADABLE:
                    indexed, seen_exactly = None, False
                else:
                    seen_exactly = exact
                into.append(Seen(entry.name, rows_touched(entry, tensor, start, end, indexed), is_write,
                                 entry.shared, seen_exactly))

    def _feed(self, label: str, accesses: list[Seen]) -> None:
        """What one op or launch touched, to the open capture's node, else to the tracker under the
        running launch, else as host work of its own on the current stream (`label` names it)."""
        if self._capture is not None:
            self._feed_capture(accesses)
            return
        record = self._record
        host = record is None
        if host:
            record = self.tracker.open_launch(self.stream_id(), f"host {label}")
            judged = [(seen, seen.region, True) for seen in accesses]  # the host declares nothing to check
        else:
            judged = [(seen, *against(seen, record.reads, record.writes)) for seen in accesses]
            # what this launch already showed adds nothing: no frame to find, nothing to judge
            judged = [j for j in judged
                      if not covers(record.observed.get((j[0].buffer, j[0].is_write), frozenset()), j[1])]
            if not judged:
                return
        frame = issuing_frame()
        try:
            for seen, region, declared in judged:
                self.tracker.observe(record, seen.buffer, region, seen.is_write, frame)
                if seen.shared and not declared:
                    self.undeclared.append(undeclared(record.op, record.stream, record.seq, seen, record.reads,
                                                       record.writes, frame))
        finally:
            if host:
                self.tracker.close_launch(record)

    def _feed_capture(self, accesses: list[Seen]) -> None:
        """Into the captured node's reads and writes, judged against what the captured op declared."""
        node_reads, node_writes, op, reads, writes = self._capture
        frame = issuing_frame()
        for seen in accesses:
            region, declared = against(seen, reads, writes)
            into = node_writes if seen.is_write else node_reads
            into[seen.buffer] = region if seen.buffer not in into else union(into[seen.buffer], region)
            if seen.shared and not declared:
                self.undeclared.append(undeclared(op, self.stream_id(), 0, seen, reads, writes, frame))
