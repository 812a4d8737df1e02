"""The prefill graph runner of `--target sglang`: SGLang's `PrefillCudaGraphRunner`, and what the harness keeps of
the graphs it captures.

The runner is SGLang's, built by its own `__init__` as a server builds it at start-up (a CP case has none: SGLang's
server resolution turns DSV4's prefill graph off under CP, `policy.runs_graph`): the phase's configuration from the published server (the
breakable backend, `cuda_graph_config.prefill.bs`), its bounds and static buffers, the static-buffer registry,
the graph backend resolved by `resolve_prefill_backend`, the captured-metadata switch and the layer model; then
its start-up capture (`capture` -> `_capture` -> `_capture_one_stream` -> `capture_one_shape` for every bucket,
largest first: the dummy batch, the backend's capture init, the graph backend's `capture_one`). Stood in there,
each the CUDA-graph machinery of a server process that one process without a model cannot have:

- the graph backend's `capture_one` (no model to warm up and record: what the graph would hold is kept,
  `real_graph.RealGraphs`), its `replay` (the harness's layers, or SGLang's forward between captured segments)
  and its `capture_session` (the global graph memory pool and the deduplicating graph registry; the breakable
  capture mode, its `replay_session`, is SGLang's);
- `graph_capture` (the TP and PP groups' communicators put in capture mode) and the global capture stream (none:
  nothing is recorded);
- the server's TP group (`get_parallel().tp_group`, built over torch.distributed by a server): rank 0 of it, whose
  barriers wait for nobody (`RankZeroGroup`);
- the capture list (`cuda_graph_config.prefill.bs`): the buckets the case's graph batches pad to in SGLang's list
  (`generate_prefill_cuda_graph_batch_sizes`), where a server captures the whole list. A batch pads to the same
  bucket (the smallest captured bucket at or above its tokens is the same in both lists) and the runner's
  ceiling refuses the same batches; the harness's request table holds only the case's requests, too few for a
  server's largest buckets. A case that replays nothing captures the smallest bucket.

Every batch the prefill graph replays runs the real backend (a draft-extend batch's target part is a verify, which
the runner refuses). No release replays
DSV4's prefill graph under tc_piecewise (`SglangApi.graph_contracts`), so the breakable backend is the only one
driven.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator
from types import SimpleNamespace
from unittest import mock

import torch

from harness.model.pools import ForwardBatch
from harness.model.runners import pad_forward_batch
from harness.probe import GraphReplay
from harness.sglang_target.platform import one_dp_rank, rank_zero
from harness.sglang_target.real_graph import RealGraphs, bucket_of

GRAPH_MAX_BS = 2048  # the reference's and the policy's max prefill graph bucket


@dataclasses.dataclass(frozen=True)
class RankZeroGroup:
    """`get_parallel().tp_group` as rank 0 of the configured TP width sees it (SGLang checks the group's width
    against `tp_size`); the other ranks are not modelled, so the capture's barriers wait for nobody."""

    world_size: int
    rank_in_group: int = 0

    def barrier(self) -> None:
        return None


def _silent_tqdm(module) -> SimpleNamespace:
    """The runner module's `tqdm` with its progress bars disabled: a server's start-up prints one per capture, a
    campaign would print one per session."""
    return SimpleNamespace(tqdm=functools.partial(module.tqdm, disable=True))


def _no_capture_stream() -> None:
    """`get_or_create_global_graph_capture_stream`: the stream a CUDA graph records on; the harness's `capture_one`
    records nothing."""
    return None


@contextlib.contextmanager
def _graph_capture(stream=None) -> Iterator[SimpleNamespace]:
    """`parallel_state.graph_capture` with no group communicators: the context SGLang's capture reads (its stream)."""
    yield SimpleNamespace(stream=stream)


def _harness_graph_backend(base: type) -> type:
    """SGLang's breakable graph backend class `base` with its `capture_one` and `replay` the harness's: there is no
    model to capture, so what a graph would hold is kept (`real_graph`) and a replay runs its segments and SGLang's
    forward between them (`SglangPrefillGraphRunner.replay`). Everything else of the backend, `replay_session`
    included, is SGLang's."""

    def replay(self, shape_key, static_forward_batch, **kwargs):
        return self.harness_graphs.replay(shape_key, static_forward_batch)

    def capture_one(self, shape_key, run_once, **kwargs):
        """SGLang's capture of a bucket (`capture_one_shape`, real-backend buckets only) ends here: there is no
        model for `run_once` to warm up and record; what the graph would hold is kept (`real_graph`)."""
        self.harness_graphs.real.captured(shape_key)

    @contextlib.contextmanager
    def capture_session(self, stream):
        self._capture_stream = stream
        try:
            with self.replay_session():
                yield
        finally:
            self._capture_stream = None

    return type(f"Harness{base.__name__}", (base,), {"replay": replay, "capture_one": capture_one, "capture_session": capture_session,
                                                      "__doc__": _harness_graph_backend.__doc__})


class SglangPrefillGraphRunner:
    """SGLang's `PrefillCudaGraphRunner`, driven per batch through its `can_run_graph` and `execute`: `load_batch`
    (the bucket, the static-buffer registry's padding, the static batch, the breakable static buffers,
    `_prepare_forward_metadata_for_replay`), the publish, `_execute_body_capture`, and
    the trim of the output to the live rows are SGLang's. The runner is built by SGLang's `__init__`
    (`sglang_built_runner`, see the module's docstring); a CP case has none (`SglangModelRunner._build_graph_runner`).
    Its graph backend is the breakable one, with DSV4's captured metadata (`bcg`, the one contract a DSV4 server
    replays). The PR-era releases key a bucket by its token count where 0.5.23 has a ShapeKey, and
    name a few switches differently."""

    def __init__(self, model_runner):
        api = model_runner.api
        self.mr, self.api = model_runner, api
        self.capture_bs = api.mods["buckets"].generate_prefill_cuda_graph_batch_sizes(GRAPH_MAX_BS)
        self.runner = self.sglang_built_runner()  # and its start-up capture of the case's buckets
        self._order_registry_fill(self.runner.buffer_registry)
        real_prepare = self.runner._prepare_forward_metadata_for_replay
        self.runner._prepare_forward_metadata_for_replay = (
            lambda forward_batch, static_forward_batch, shape_key:
            self._prepare_real_replay(real_prepare, forward_batch, static_forward_batch, shape_key))

    # -- SGLang's __init__ and start-up capture ----------------------------------------------------------------

    def case_buckets(self) -> list[int]:
        """The buckets of SGLang's capture list that the case's graph batches pad to (the smallest when none)."""
        pad = self.api.mods["base_graph_runner"].BaseCudaGraphRunner._pad_to_bucket
        top = max(self.capture_bs)
        buckets = {pad(batch.num_tokens, self.capture_bs) for batch in self.mr.case.batches
                   if batch.graph and batch.num_tokens <= top}
        return sorted(buckets) or [min(self.capture_bs)]

    def sglang_built_runner(self):
        """`PrefillCudaGraphRunner(model_runner)`, as a server builds it, with the stand-ins of the module's
        docstring; the captured metadata of every bucket kept for the real path (`RealGraphs`)."""
        mods, mr = self.api.mods, self.mr
        graph_runner = mods["graph_runner"]
        runner = object.__new__(graph_runner.PrefillCudaGraphRunner)
        self.real = RealGraphs(runner, mr)
        observer = mr.harness_device.observer
        with contextlib.ExitStack() as stack:
            stack.enter_context(observer.suspended() if observer is not None else contextlib.nullcontext())
            stack.enter_context(mr.eager.sglang())
            stack.enter_context(self._start_up_patches(graph_runner))
            stack.enter_context(mr.building_graph_runner())
            graph_runner.PrefillCudaGraphRunner.__init__(runner, mr)
        # A server's start-up is over before its first request: the capture's device work (its dummy batch's writes
        # to the request table, the captured metadata) has finished before the case's world is loaded.
        mr.harness_device.synchronize()
        # The device module the runner and its graph backend synchronize on: the model runner's (the simulator's
        # on the CPU); `__init__` ran with the tensors' device, from which it took torch's module for it.
        runner.device_module = runner.backend._device_module = mr.device_module
        return runner

    @contextlib.contextmanager
    def _start_up_patches(self, graph_runner) -> Iterator[None]:
        """The start-up capture's stand-ins (the module's docstring): the graph backend resolved by SGLang and then
        given the harness's capture and replay, the capture context and stream, the rank-0 TP group, the
        captured buckets, and no progress bar. The TP group is the server's (0.5.23) or the model runner's (0.5.21's
        breakable backend reads `model_runner.tp_group`)."""
        mods = self.api.mods
        graph_config, runtime = mods["graph_config"], mods["runtime"]
        resolve = graph_runner.resolve_prefill_backend

        def resolve_prefill_backend(runner):
            backend = resolve(runner)
            backend.__class__ = _harness_graph_backend(type(backend))
            backend.harness_graphs = self
            return backend

        exec_config = runtime.get_exec()
        group = RankZeroGroup(runtime.get_parallel().tp_size)
        phase = {"backend": graph_config.Backend.BREAKABLE, "bs": self.case_buckets()}
        if "max_context_size" in {f.name for f in dataclasses.fields(graph_config.PhaseConfig)}:  # 0.5.21 on
            phase["max_context_size"] = self.mr.session.sizes.max_context
        phases = graph_config.with_phase(exec_config.graph.cuda_graph_config, "prefill", **phase)
        with mock.patch.object(graph_runner, "resolve_prefill_backend", resolve_prefill_backend), \
                mock.patch.object(graph_runner, "graph_capture", _graph_capture), \
                mock.patch.object(graph_runner, "get_or_create_global_graph_capture_stream", _no_capture_stream), \
                mock.patch.object(graph_runner, "tqdm", _silent_tqdm(graph_runner.tqdm)), \
                exec_config.graph.override(cuda_graph_config=phases), \
                mock.patch.object(self.mr, "tp_group", group, create=True), \
                runtime.get_parallel().override(tp_group=group, **rank_zero(self.api), **one_dp_rank(self.api)):
            yield

    # -- per batch ------------------------------------------------------------------------------------------

    def _order_registry_fill(self, registry) -> None:
        """The registry's `fill_from` (SGLang's copy of a batch into the static buffers, padding reset) runs
        as host work on the current stream, after the replays already queued there, as on CUDA."""
        real_fill, dev = registry.fill_from, self.mr.harness_device

        def fill_from(forward_batch, **kwargs):
            with dev.host_work("PrefillCudaGraphRunner.load_batch.fill_from",
                               reads={"fb.input_ids": None, "fb.positions": None, "fb.out_cache_loc": None},
                               writes={"graph.static_inputs": None}):
                return real_fill(forward_batch, **kwargs)

        registry.fill_from = fill_from

    def _padded(self, static_forward_batch, bucket: int) -> ForwardBatch:
        """The live harness batch with the model's activations padded as SGLang pads them, and positions,
        out_cache_loc and input_ids the registry's static buffers that `load_batch` filled."""
        return dataclasses.replace(pad_forward_batch(self.mr.live_batch, bucket),
                                   positions=static_forward_batch.positions,
                                   out_cache_loc=static_forward_batch.out_cache_loc,
                                   input_ids=static_forward_batch.input_ids)

    def _note_replay(self, static_forward_batch, bucket: int) -> None:
        """The replay, with how many of the bucket's padded rows SGLang's `load_batch` handed it holding something other
        than 0: its prefill registry pads input ids, positions and output slots with 0 (the dummy slot) every replay
        (`PaddingPolicy.ZERO`), so a row that does not held an earlier step's token. Read in the static batch SGLang
        built, before the publish (on CUDA the read waits for what the forward stream was given before it: this
        batch's copies into the registry)."""
        live = self.mr.live_batch.num_tokens
        rows = slice(live, bucket)
        stale = ((static_forward_batch.input_ids[rows] != 0) | (static_forward_batch.positions[rows] != 0)
                 | (static_forward_batch.out_cache_loc[rows] != 0))
        self.mr.probe.note(GraphReplay(bucket=bucket, tokens=live, stale_padded_rows=int(stale.sum())))

    def _prepare_real_replay(self, real_prepare, forward_batch, static_forward_batch, shape_key):
        """Entered from SGLang's `load_batch` once the static batch exists: the bucket as SGLang's start-up capture
        kept it (`real_graph.RealGraphs`), its static inputs loaded, then SGLang's own replay prep (the backend's
        refresh and its resolver)."""
        mr, bucket = self.mr, bucket_of(shape_key)
        padded = self._padded(static_forward_batch, bucket)
        self.real.ensure(bucket, padded)
        self.real.load_inputs(bucket, padded)
        self._note_replay(static_forward_batch, bucket)
        mr.replay_batch = padded
        return real_prepare(forward_batch, static_forward_batch, shape_key)

    def replay(self, shape_key, static_forward_batch):
        """The captured body of `shape_key`, replayed: the breakable graph's captured segments and, between them,
        SGLang's forward over the captured metadata (`eager.EagerPath.layers`), rows first as SGLang's outputs are
        (the body's hidden states)."""
        mr = self.mr
        mr.bridge_delay()
        out = mr.eager.layers(mr.replay_batch, static_forward_batch, self.real.buckets[bucket_of(shape_key)])
        return out.transpose(0, 1)

    def can_run_graph(self, live) -> bool:
        """SGLang's `can_run_graph` (and through it `can_replay_locally`: the token ceiling, the padding
        factor, target-verify and hidden-mode refusals)."""
        return self.runner.can_run_graph(live)

    def execute(self, live) -> torch.Tensor:
        """`live`: the real ForwardBatch the forward context holds."""
        try:
            output = self.runner.execute(live)
        finally:
            self.mr.replay_batch = None
        return output.hidden_states.transpose(0, 1)



__all__ = ["GRAPH_MAX_BS", "RankZeroGroup", "SglangPrefillGraphRunner"]
