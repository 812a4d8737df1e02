"""One short test per observer rule, with synthetic tensors and streams (as CSAN's own tests), then a
target that reads a shared table late without declaring it, found by the happens-before oracle alone."""

from __future__ import annotations

import inspect
import os
import sys
import textwrap
import types

import pytest
import torch

from harness.case import Batch, Case, Mutation, Request
from harness.device import SimDevice
from harness.device.cuda import CudaDevice
from harness.engine import execute, run_case
from harness.errors import InvalidArgument
from harness.hb import HappensBefore
from harness.model.runners import ModelRunner
from harness.observe import Observer, issuing_frame, kernel_access_kinds
from harness.oracles.happens_before import hb_oracle
from harness.targets import Classes, ReferenceTarget

F, S = 1001, 1002  # two synthetic stream ids


class Streams:
    """An observer over a bare tracker whose current stream the test sets, as CSAN's tests switch streams."""

    def __init__(self) -> None:
        self.hb = HappensBefore()
        self.current = F
        self.observer = Observer(self.hb, lambda: self.current)

    def on(self, stream: int, fn) -> None:
        """`fn` run by the host on `stream`, outside any launch."""
        self.current = stream
        with self.observer.observing():
            fn()

    def launch(self, stream: int, fn, op: str = "op", reads=None, writes=None) -> None:
        """`fn` as one launched operation with its declarations."""
        record = self.hb.open_launch(stream, op, reads or {}, writes or {})
        with self.observer.observing():
            self.observer.attributed(record, fn)()


@pytest.fixture
def streams() -> Streams:
    return Streams()


def table(rows: int = 6, cols: int = 4) -> torch.Tensor:
    return torch.arange(rows * cols, dtype=torch.int32).reshape(rows, cols)


def test_a_view_of_rows_touches_those_rows(streams):
    r2t = table()
    streams.observer.register("req_to_token", r2t)
    streams.on(F, lambda: r2t[3].sum())
    streams.on(S, lambda: r2t[4].fill_(0))
    assert streams.hb.conflicts == []
    streams.on(S, lambda: r2t[2:4].fill_(0))
    (conflict,) = streams.hb.conflicts
    assert conflict.earlier.region == frozenset({3}) and not conflict.earlier.is_write
    assert conflict.later.region == frozenset({2, 3}) and conflict.later.is_write


def test_a_view_alone_reads_only_metadata(streams):
    r2t = table()
    streams.observer.register("req_to_token", r2t)
    streams.on(F, lambda: r2t[1:3].transpose(0, 1))
    streams.on(S, lambda: r2t.fill_(0))
    assert streams.hb.conflicts == []


def test_an_in_place_op_writes(streams):
    f2s = torch.zeros(8, dtype=torch.int64)
    streams.observer.register("full_to_swa", f2s)
    streams.on(F, lambda: f2s.sum())
    streams.on(S, lambda: f2s.sum())
    assert streams.hb.conflicts == []  # two reads never conflict
    streams.on(S, lambda: f2s.add_(1))
    (conflict,) = streams.hb.conflicts
    assert conflict.later.is_write and conflict.later.region is None


def test_an_out_argument_is_written(streams):
    out, a = torch.zeros(4), torch.ones(4)
    streams.observer.register("out", out)
    streams.observer.register("a", a)
    streams.on(F, lambda: out.sum())
    streams.on(S, lambda: torch.add(a, a, out=out))
    (conflict,) = streams.hb.conflicts
    assert conflict.earlier.buffer == "out" and conflict.later.is_write
    streams.on(F, lambda: a.sum())  # `a` was only read by the add: read-read is fine
    assert len(streams.hb.conflicts) == 1


def test_index_put_writes_the_indexed_rows(streams):
    f2s = torch.zeros(8, dtype=torch.int64)
    streams.observer.register("full_to_swa", f2s)
    streams.on(F, lambda: f2s[5].item())
    streams.on(S, lambda: f2s.index_put_((torch.tensor([1, 2]),), torch.tensor([7, 7])))
    assert streams.hb.conflicts == []
    streams.on(S, lambda: f2s.index_put_((torch.tensor([5]),), torch.tensor([7])))
    (conflict,) = streams.hb.conflicts
    assert conflict.later.region == frozenset({5})


@pytest.mark.parametrize("op", ["index_select", "index_fill_", "index_copy_", "index"])
def test_index_ops_touch_the_rows_their_host_index_names(streams, op):
    r2t = table()
    streams.observer.register("req_to_token", r2t)
    rows = torch.tensor([1, 5])
    run = {"index_select": lambda: r2t.index_select(0, rows),
           "index_fill_": lambda: r2t.index_fill_(0, rows, 0),
           "index_copy_": lambda: r2t.index_copy_(0, rows, torch.zeros(2, 4, dtype=torch.int32)),
           "index": lambda: r2t[torch.tensor([1, -1])]}[op]  # negative rows count from the end
    streams.on(F, run)
    (access,) = streams.hb._live["req_to_token"]
    assert access.region == frozenset({1, 5})


def test_an_index_the_host_cannot_read_gives_the_whole_buffer(streams):
    f2s = torch.zeros(8, dtype=torch.int64)
    streams.observer.register("full_to_swa", f2s)
    mask = torch.zeros(8, dtype=torch.bool)
    mask[2] = True
    streams.on(F, lambda: f2s[mask])  # a mask: the rows are not read, the span is taken
    (access,) = streams.hb._live["full_to_swa"]
    assert access.region is None


def test_a_cross_stream_read_after_an_event(streams):
    """The published event orders the reads before it, never a read issued after it."""
    r2t = table()
    streams.observer.register("req_to_token", r2t)
    streams.on(F, lambda: r2t[2].sum())  # the snapshot
    streams.hb.record(2001, F)  # read-done
    streams.hb.wait(S, 2001)
    streams.on(S, lambda: r2t[2].fill_(0))  # the scheduler's rewrite after the event
    assert streams.hb.conflicts == []
    streams.on(F, lambda: r2t[2].clone())  # a late read
    (conflict,) = streams.hb.conflicts
    assert conflict.earlier.stream == S and conflict.later.stream == F and not conflict.later.is_write


def test_a_host_synchronisation_orders_everything_before_it(streams):
    r2t = table()
    streams.observer.register("req_to_token", r2t)
    streams.on(F, lambda: r2t.fill_(1))
    streams.hb.sync_device()
    streams.on(S, lambda: r2t.sum())
    assert streams.hb.conflicts == []
    streams.on(F, lambda: r2t.fill_(2))  # no sync since the read
    (conflict,) = streams.hb.conflicts
    assert conflict.earlier.stream == S and conflict.later.is_write


def test_an_undeclared_access_is_reported_with_its_frame(streams):
    r2t = table()
    streams.observer.register("req_to_token", r2t)

    def reads_row_four():
        r2t[4].sum()

    streams.launch(F, lambda: r2t[1].sum(), op="declared", reads={"req_to_token": frozenset({1})})
    assert streams.observer.undeclared == []
    streams.launch(F, reads_row_four, op="narrow", reads={"req_to_token": frozenset({1})})
    streams.launch(F, reads_row_four, op="silent")
    narrow, silent = streams.observer.undeclared
    assert narrow.op == "narrow" and narrow.declared_at_all and narrow.region == frozenset({4})
    assert silent.op == "silent" and not silent.declared_at_all
    line = inspect.getsourcelines(reads_row_four)[1] + 1
    assert silent.frame == f"tests/test_observer.py:{line} in reads_row_four"
    assert "undeclared read of 'req_to_token' (indices {4})" in str(silent)


def test_an_access_whose_rows_cannot_be_seen_is_narrowed_by_its_declaration(streams):
    """A mask (like a GPU index, or a kernel's own pointer arithmetic) hides the rows: the buffer is
    checked against the declaration, and the declared rows are what the tracker judges."""
    r2t = table()
    streams.observer.register("req_to_token", r2t)
    mask = torch.tensor([False, False, True, False, False, False])
    streams.launch(F, lambda: r2t[mask], op="declared", reads={"req_to_token": frozenset({2})})
    assert streams.observer.undeclared == []
    (observed,) = [a for a in streams.hb._live["req_to_token"] if a.frame is not None]
    assert observed.region == frozenset({2})
    streams.launch(F, lambda: r2t[mask], op="silent")
    (undeclared,) = streams.observer.undeclared
    assert undeclared.op == "silent" and undeclared.region is None


def test_a_declared_read_does_not_cover_an_observed_write(streams):
    f2s = torch.zeros(8, dtype=torch.int64)
    streams.observer.register("full_to_swa", f2s)
    streams.launch(S, lambda: f2s.zero_(), op="clear", reads={"full_to_swa": None})
    (undeclared,) = streams.observer.undeclared
    assert undeclared.is_write


def test_an_unshared_buffer_is_tracked_but_needs_no_declaration(streams):
    scratch = torch.zeros(4)
    streams.observer.register("scratch", scratch, shared=False)
    streams.launch(F, lambda: scratch.fill_(1))
    streams.on(S, lambda: scratch.sum())
    assert streams.observer.undeclared == [] and len(streams.hb.conflicts) == 1


def test_host_ops_are_not_checked_against_declarations(streams):
    r2t = table()
    streams.observer.register("req_to_token", r2t)
    streams.on(F, lambda: r2t.zero_())  # the scheduler's own allocation, on the host
    assert streams.observer.undeclared == []
    (access,) = streams.hb._live["req_to_token"]
    assert access.op == "host aten.zero_.default"


def test_registration_by_memory(streams):
    pool = torch.zeros(2, 5, 3)
    for layer in range(2):
        streams.observer.register(f"swa_kv[{layer}]", pool[layer])
    with pytest.raises(InvalidArgument, match="'whole' overlaps the registered buffer 'swa_kv\\[0\\]'"):
        streams.observer.register("whole", pool)
    streams.on(S, lambda: pool.sum())  # spans both layers
    assert set(streams.hb._live) == {"swa_kv[0]", "swa_kv[1]"}
    streams.observer.register("swa_kv[0]", torch.zeros(3))  # a name moves to its new tensor
    streams.on(F, lambda: pool[0].fill_(1))
    assert len(streams.hb.conflicts) == 0  # layer 0's old memory is no longer named


def test_a_session_s_buffers_default_to_its_tables_and_kv_pools_per_layer_or_are_its_own(streams):
    """`register_session`: the tables and `kv_state()` (a 3-D pool as `name[layer]`) by default; a session whose
    KV lives elsewhere names its buffers itself (`observed_buffers`), and only those are watched."""
    session = ReferenceTarget().open(Case(), SimDevice())
    streams.observer.register_session(session)
    layers = len(Case().dims.layer_ratios)
    want = {"req_to_token", "full_to_swa", "full_to_hisparse", "indexer_k",
            *(f"{pool}[{layer}]" for pool in ("swa_kv", "extra_kv") for layer in range(layers))}
    assert set(streams.observer._by_name) == want
    own = torch.zeros(4, 8, dtype=torch.uint8)
    session.observed_buffers = lambda: {"req_to_token": session.req_to_token, "swa_kv[0]": own}
    watcher = Streams()
    watcher.observer.register_session(session)
    assert set(watcher.observer._by_name) == {"req_to_token", "swa_kv[0]"}
    watcher.on(F, lambda: own[1].fill_(3))
    watcher.on(S, lambda: session.token_to_kv_pool.swa_kv[0].fill_(1))  # no longer a watched buffer
    assert set(watcher.hb._live) == {"swa_kv[0]"}


def test_the_frame_prefers_sglang(monkeypatch):
    code = compile("def run(f):\n    return f()\n", os.path.join("site-packages", "sglang", "srt", "fake.py"), "exec")
    scope: dict = {}
    exec(code, scope)
    monkeypatch.delitem(sys.modules, "sglang", raising=False)  # as in a process that never imported sglang
    assert scope["run"](lambda: issuing_frame()).startswith("tests/test_observer.py:")
    monkeypatch.setitem(sys.modules, "sglang", types.ModuleType("sglang"))
    assert scope["run"](lambda: issuing_frame()) == "sglang/srt/fake.py:2 in run"  # past the inner lambda


# -- graph replays on the simulator -----------------------------------------------------------------------

def test_a_graph_replay_is_observed_as_its_nodes():
    device = SimDevice(observe=True)
    r2t = table()
    device.observer.register("req_to_token", r2t)
    seen = torch.zeros(4, dtype=torch.int32)
    with device.observing():
        with device.capture("g") as graph:
            device.launch("captured_read", lambda: seen.copy_(r2t[2]))  # declares nothing
        with device.stream(device.forward_stream):
            device.replay(graph)
        with device.stream(device.schedule_stream):
            device.launch("rewrite", lambda: r2t[2].fill_(0), writes={"req_to_token": frozenset({2})})
        device.synchronize()
    (conflict,) = device.tracker.conflicts
    assert conflict.earlier.graph == "g" and conflict.earlier.op == "captured_read"
    assert conflict.earlier.frame.endswith("in <lambda>")
    (undeclared,) = device.observer.undeclared
    assert undeclared.op == "captured_read" and undeclared.buffer == "req_to_token"


def test_a_graph_replay_before_an_event_is_ordered():
    device = SimDevice(observe=True)
    r2t = table()
    device.observer.register("req_to_token", r2t)
    with device.observing():
        with device.capture("g") as graph:
            device.launch("captured_read", lambda: r2t[2].sum(), reads={"req_to_token": frozenset({2})})
        with device.stream(device.forward_stream):
            device.replay(graph)
            event = device.record_event()
        device.wait_event(device.schedule_stream, event)
        with device.stream(device.schedule_stream):
            device.launch("rewrite", lambda: r2t[2].fill_(0), writes={"req_to_token": frozenset({2})})
        device.synchronize()
    assert device.tracker.conflicts == [] and device.observer.undeclared == []


# -- Triton kernels (optional: the CI venv has no Triton) -------------------------------------------------

COPY_KERNEL = textwrap.dedent("""
    import triton
    import triton.language as tl

    @triton.jit
    def scale_kernel(src_ptr, dst_ptr, count_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(src_ptr + offs, mask=mask)
        out = dst_ptr + offs
        tl.store(out, x * 2, mask=mask)
        tl.atomic_add(count_ptr, 1)
""")


@pytest.fixture
def triton_kernel(tmp_path, monkeypatch):
    pytest.importorskip("triton", reason="triton is not installed in this environment (the CI venv has none)")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # read when the kernel is decorated: the CPU interpreter
    path = tmp_path / "scale_kernel.py"
    path.write_text(COPY_KERNEL)
    scope: dict = {"__file__": str(path)}
    exec(compile(COPY_KERNEL, str(path), "exec"), scope)
    return scope["scale_kernel"]


def test_triton_pointer_arguments_by_what_the_kernel_does(triton_kernel):
    kinds = kernel_access_kinds(triton_kernel.fn)
    assert kinds["src_ptr"] == (True, False)
    assert kinds["dst_ptr"] == (False, True)
    assert kinds["count_ptr"] == (True, True)  # an atomic reads and writes


def test_a_triton_launch_is_observed(streams, triton_kernel):
    src, dst, count = torch.arange(8.0), torch.zeros(8), torch.zeros(1, dtype=torch.int32)
    for name, tensor in (("src", src), ("dst", dst), ("count", count)):
        streams.observer.register(name, tensor)
    streams.on(S, lambda: src.sum())
    streams.launch(F, lambda: triton_kernel[(1,)](src, dst, count, 8, BLOCK=8), op="scale",
                   reads={"src": None}, writes={"dst": None})
    assert torch.equal(dst, torch.arange(8.0) * 2)
    assert streams.hb.conflicts == []  # src was only loaded: read-read
    write, read = streams.observer.undeclared  # the counter's atomic was not declared: both kinds
    assert {write.buffer, read.buffer} == {"count"} and write.is_write and not read.is_write
    assert write.frame.startswith("tests/test_observer.py:")
    streams.on(S, lambda: dst.sum())
    (conflict,) = streams.hb.conflicts
    assert conflict.earlier.op == "scale" and conflict.earlier.is_write


def test_a_triton_pointer_is_narrowed_to_the_declared_rows(streams, triton_kernel):
    """The kernel reaches rows through its own arithmetic: the declared rows stand, and are judged."""
    src, dst, count = torch.arange(8.0), torch.zeros(8), torch.zeros(1, dtype=torch.int32)
    streams.observer.register("full_to_swa", src)
    streams.launch(F, lambda: triton_kernel[(1,)](src, dst, count, 8, BLOCK=8), op="scale",
                   reads={"full_to_swa": frozenset({1, 2})})
    assert streams.observer.undeclared == []
    streams.on(S, lambda: src[5].fill_(0))  # a slot the kernel did not declare
    assert streams.hb.conflicts == []
    streams.on(S, lambda: src[2].fill_(0))
    assert len(streams.hb.conflicts) == 1


def test_the_sparse_attention_kernel_only_stores_its_output():
    pytest.importorskip("triton", reason="triton is not installed in this environment (the CI venv has none)")
    from harness.kernels._sparse_attention_kernel import sparse_attention_fwd

    kinds = kernel_access_kinds(sparse_attention_fwd.fn)
    assert {p: kinds[p] for p in ("q_ptr", "kv_ptr", "idx_ptr", "sink_ptr", "out_ptr")} == {
        "q_ptr": (True, False), "kv_ptr": (True, False), "idx_ptr": (True, False), "sink_ptr": (True, False),
        "out_ptr": (False, True)}


# -- a target that reads the live table after publication, declaring nothing -------------------------------

def dump_first_row(dump: torch.Tensor, r2t: torch.Tensor, row: int) -> None:
    dump.copy_(r2t[row])


class DebugDumpRunner(ModelRunner):
    """After the forward (so after the read-done event), a debug dump of the first request's live
    `req_to_token` row, inside an op that declares nothing."""

    def forward(self, fb, *, graph):
        outputs = super().forward(fb, graph=graph)
        r2t = self.req_to_token_pool.req_to_token
        row = fb.req_pool_indices_cpu[0]
        dump = torch.empty_like(r2t[row])
        self.device.launch("debug.dump", lambda: dump_first_row(dump, r2t, row))
        return outputs


class DebugDumpTarget(ReferenceTarget):
    def __init__(self):
        super().__init__(Classes(model_runner=DebugDumpRunner), name="debug-dump")


PUBLISHING = Case(batches=(Batch(requests=(Request(9, 6), Request(2, 3)),
                                 mutations=(Mutation("req_to_token_rewrite", target="batch", count=2),)),))
DUMP_LINE = inspect.getsourcelines(dump_first_row)[1] + 1


def test_a_late_undeclared_read_is_found_by_happens_before_alone(harness_device):
    result = run_case(DebugDumpTarget(), PUBLISHING, harness_device, oracles=frozenset({"happens-before"}))
    kinds = {f.kind for f in result.findings}
    assert kinds == {"unordered-access", "undeclared-access"}, [f.message for f in result.findings]
    race = next(f for f in result.findings if f.kind == "unordered-access")
    assert "'debug.dump'" in race.message and "'req_to_token'" in race.message
    assert f"tests/test_observer.py:{DUMP_LINE} in dump_first_row" in race.message


def test_the_same_case_is_clean_without_the_dump(harness_device):
    assert run_case(ReferenceTarget(), PUBLISHING, harness_device, oracles=frozenset({"happens-before"})).findings == []


def test_declarations_alone_miss_the_dump():
    """Why the observer exists: judged by declarations only, the late read is invisible."""
    assert hb_oracle(execute(DebugDumpTarget(), PUBLISHING, "cpu", observe=False)) == []


# -- CUDA: real streams, events a target records itself, real graphs ----------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("waits", [True, False])
def test_cuda_events_a_target_records_itself_order_accesses(waits):
    device = CudaDevice(observe=True)
    table = torch.zeros(64, device="cuda")
    device.observer.register("req_to_token", table)
    first, second = torch.cuda.Stream(), torch.cuda.Stream()  # streams the device never made
    with device.observing():
        with torch.cuda.stream(first):
            table.fill_(1)
            done = torch.cuda.Event()
            done.record()
        with torch.cuda.stream(second):
            if waits:
                second.wait_event(done)
            table.sum()
        torch.cuda.synchronize()
    assert len(device.tracker.conflicts) == (0 if waits else 1)


@pytest.mark.gpu
def test_a_cuda_graph_carries_what_its_capture_was_seen_to_touch():
    device = CudaDevice(observe=True)
    r2t = torch.zeros(6, 4, dtype=torch.int32, device="cuda")
    seen = torch.zeros(4, dtype=torch.int32, device="cuda")
    device.observer.register("req_to_token", r2t)
    with device.observing():
        with device.stream(device.forward_stream):
            with device.capture("g") as graph:
                device.launch("captured_read", lambda: seen.copy_(r2t[2]))
            device.replay(graph)
        with device.stream(device.schedule_stream):
            device.launch("rewrite", lambda: r2t[2].fill_(0), writes={"req_to_token": frozenset({2})})
        device.synchronize()
    (conflict,) = device.tracker.conflicts
    assert conflict.earlier.graph == "g" and conflict.earlier.region == frozenset({2})
    (undeclared,) = device.observer.undeclared
    assert undeclared.op == "captured_read"
