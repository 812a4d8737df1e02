"""EAGLE's draft-extend CUDA graph of `--target sglang`: SGLang's `EAGLEDraftExtendCudaGraphRunner`, driven for a
draft-extend batch (`DRAFT_EXTEND_V2`) of the draft runner as `EAGLEWorkerV2._draft_extend_for_decode` drives it.

After a verify the EAGLE worker extends its draft model over every request's `speculative_num_draft_tokens` window
(`prepare_for_draft_extend`), through the draft-extend graph runner where it can run (`can_run_graph`) and the draft
runner's eager forward otherwise. What runs here is SGLang's own (`eagle_draft_extend_cuda_graph_runner.py`):

- start-up: `capture_one_shape` for every captured batch size (the static `ForwardBatch` over the runner's buffers,
  `EagleDraftExtendInput`, the backend's `init_forward_metadata_out_graph(in_capture=True)`, SGLang's `run_once`
  closure handed to the graph backend's `capture_one`);
- per batch: `can_run_graph` and `execute`: the copies into the static buffers with SGLang's padding, the backend's
  `init_forward_metadata_out_graph` over the static view (the draft-extend metadata: `req_to_token` and the
  Full-to-SWA mapping read), the release's publication of the read-done event, the graph's replay. Before the plan
  the padded requests are read in the static buffers (`DraftGraphReplay`, judged by `freshness`): `execute` points
  each at the reserved request-pool row 0, every release.

Stood in, each the CUDA-graph machinery one process without a model cannot have (the prefill runner's stand-ins,
`graph_runner.py`, are the same in kind):

- the runner object is built with the fields its `__init__` sets (`__init__` itself resolves the server's capture
  list, its DP and MoE gathers and a logits buffer, then captures through `DecodeCudaGraphRunner.capture`'s memory
  pool): one attention-DP rank, no gathers, no DeepEP, padding on, the buffers SGLang's dataclass holds sized for
  the case's batch sizes;
- the graph backend (`resolve_decode_backend`'s): `capture_one` keeps SGLang's `run_once` (nothing is warmed up or
  recorded), and `replay` runs it again over the static buffers: what a CUDA graph's replay re-executes, the
  backend's `init_forward_metadata_in_graph` (recorded in the graph: it re-translates the static write locations
  through the live Full-to-SWA mapping) and the model's forward, on the forward stream after what `execute` issued
  before it. The in-graph metadata step is one launch (declared: the mapping and the static buffers); the model's
  layer is the draft's NextN layer through SGLang's backend `forward` (`eager.EagerPath`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import torch

from harness.model.runners import pad_forward_batch
from harness.probe import DraftGraphReplay, PlanKind

# What the runner's two metadata steps read besides the batch's rows of `req_to_token`: the mapping (the SWA page
# indices and write locations, planned outside the graph; the write locations translated again by the recorded
# in-graph step) and the runner's static buffers (`execute` copies the batch into them first).
_PLAN_READS = ("full_to_swa", "draft_graph.static_inputs")
# The request-pool row a padded request of a draft-extend bucket reads: SGLang's reserved slot 0, "req_to_token[0, :]
# is all zeros from init" (`EAGLEDraftExtendCudaGraphRunner.execute`, 0.5.19 to 0.5.23).
_PADDED_REQUEST_ROW = frozenset({0})
# What `execute` copies into the static buffers before it plans, publishes and replays.
_BATCH_READS = ("fb.input_ids", "fb.seq_lens", "fb.out_cache_loc", "fb.positions", "fb.req_pool_indices")


class _ReplayedGraphs:
    """The graph backend's part the harness keeps: per captured batch size, SGLang's `run_once`."""

    def __init__(self, graph_runner: "SglangDraftExtendGraphRunner"):
        self.owner = graph_runner
        self.captured: dict[int, object] = {}

    def capture_one(self, shape_key, run_once, **kwargs) -> None:
        del kwargs
        self.captured[shape_key.size] = run_once

    def replay(self, shape_key, forward_batch):
        del forward_batch  # the captured closure holds the static batch it was captured with
        return self.owner.replay(self.captured[shape_key.size])

    def can_run(self, forward_batch, shape_key) -> bool:
        del forward_batch
        return shape_key.size in self.captured


class SglangDraftExtendGraphRunner:
    """SGLang's `EAGLEDraftExtendCudaGraphRunner` for the session's draft runner (`SglangDraftRunner`), capturing the
    batch sizes the case's draft-extend graph batches pad to; `width`: the server's draft tokens per request."""

    def __init__(self, draft_runner, *, width: int, batch_sizes: list[int]):
        self.mr, self.api, self.width = draft_runner, draft_runner.api, width
        self.graphs = _ReplayedGraphs(self)
        self.last_output: torch.Tensor | None = None
        self.runner = self._object_built_runner(sorted(batch_sizes))
        self._capture()

    # -- start-up ------------------------------------------------------------------------------------------

    def _object_built_runner(self, capture_bs: list[int]):
        mods, mr = self.api.mods, self.mr
        module = mods["draft_graph_runner"]
        runner = object.__new__(module.EAGLEDraftExtendCudaGraphRunner)
        backend, width, max_bs = mr.attn_backend, self.width, max(capture_bs)
        runner.__dict__.update(
            eagle_worker=None, model_runner=mr, forward_mode=mods["forward"].ForwardMode.DRAFT_EXTEND_V2,
            device=mr.device, device_module=mr.device_module, tp_size=1, attn_dp_size=1, pp_size=1,
            enable_torch_compile=False, disable_padding=False, require_gathered_buffer=False,
            require_mlp_tp_gather=False, require_mlp_sync=False, require_attn_tp_gather=False,
            enable_profile_cuda_graph=False, speculative_num_steps=width - 1, draft_extend_attn_backend=backend,
            attn_backend=backend, compile_bs=[], enable_pdmux=False, record_nolora_graph=False, is_dllm=False,
            deepep_adapter=module.DeepEPCudaGraphRunnerAdapter(), capture_forward_mode=None,
            capture_hidden_mode=mods["forward"].CaptureHiddenMode.LAST, capture_bs=capture_bs,
            captured_req_width=width, max_bs=max_bs, max_num_token=max_bs * width, backend=self.graphs)
        runner.capture_forward_mode = runner.forward_mode
        with self.mr.eager.sglang():
            backend.init_cuda_graph_state(max_bs, max_bs * width)
        runner.seq_len_fill_value = backend.get_cuda_graph_seq_len_fill_value()
        runner.extend_seq_lens_cpu = [width] * max_bs
        runner.buffers = self._buffers(module.EagleDraftExtendInputBuffers, runner)
        # No model kernels to autotune before the capture (`maybe_flashinfer_autotune_speculative_draft`).
        mr._flashinfer_spec_draft_autotuned_phases = {f"{module.__name__}.EAGLEDraftExtendCudaGraphRunner"}
        return runner

    def _buffers(self, cls, runner):
        """SGLang's buffer dataclass of this release, its tensors as `__init__` allocates them (no hidden states:
        the harness's NextN layer takes no target hidden states; no gathers; no DSA seed)."""
        tdev, width, max_bs = self.mr.harness_device.torch_device, self.width, runner.max_bs
        tokens, fill = max_bs * width, runner.seq_len_fill_value

        def zeros(n, dtype=torch.int64):
            return torch.zeros((n,), dtype=dtype, device=tdev)

        tensors = dict(
            input_ids=zeros(tokens), req_pool_indices=zeros(max_bs), mamba_track_indices=None,
            out_cache_loc=torch.ones((tokens,), dtype=torch.int64, device=tdev), positions=zeros(tokens),
            mrope_positions=torch.zeros((3, tokens), dtype=torch.int64, device=tdev), hidden_states=None,
            seq_lens=torch.full((max_bs,), fill, dtype=torch.int64, device=tdev),
            seq_lens_cpu=torch.full((max_bs,), fill, dtype=torch.int64),
            extend_seq_lens=torch.full((max_bs,), width, dtype=torch.int32, device=tdev),
            num_correct_drafts=torch.full((max_bs,), width, dtype=torch.int32, device=tdev),
            num_accept_tokens=torch.full((max_bs,), width, dtype=torch.int32, device=tdev),
            select_index=zeros(max_bs), next_token_logits_buffer=torch.zeros((tokens, 1), device=tdev),
            global_num_tokens_gpu=None, global_num_tokens_for_logprob_gpu=None, dsa_seed_topk_capture=None)
        taken = {f.name for f in dataclasses.fields(cls)}
        missing = taken - set(tensors)
        if missing:
            raise RuntimeError(f"sglang {self.api.version}'s EagleDraftExtendInputBuffers has fields the harness does "
                               f"not fill: {sorted(missing)}")
        return cls(**{name: value for name, value in tensors.items() if name in taken})

    def _capture(self) -> None:
        """SGLang's `capture_one_shape` for each batch size, largest first, as `DecodeCudaGraphRunner.capture` runs
        them; at start-up, before any request, so not observed (it cannot race with anything)."""
        observer = self.mr.harness_device.observer
        with observer.suspended() if observer is not None else contextlib.nullcontext(), self.mr.eager.sglang():
            for bs in sorted(self.runner.capture_bs, reverse=True):
                self.runner.capture_one_shape(bs, forward=None)
        self.mr.harness_device.synchronize()

    # -- per batch -------------------------------------------------------------------------------------------

    def can_run_graph(self, forward_batch) -> bool:
        return self.runner.can_run_graph(forward_batch)

    def execute(self, forward_batch) -> torch.Tensor:
        """SGLang's `execute` of a live draft-extend batch; the draft layer's output over the live rows
        [rows, heads, 512] (the release trims or selects its own outputs: the attention is what is compared)."""
        select = torch.arange(forward_batch.batch_size, device=forward_batch.seq_lens.device) * self.width \
            + self.width - 1
        # from 0.5.21 the runner gathers each request's last accepted row in the graph (its static `select_index`)
        selects = "select_index" in {f.name for f in dataclasses.fields(self.runner.buffers)}
        kwargs = {"select_index": select} if selects else {}
        self.last_output = None
        # `execute` first copies the batch into the static buffers, on the forward stream after what it was given
        # (the real copies run on the host right after this point, before anything else is issued)
        with self.mr.harness_device.host_work("EAGLEDraftExtendCudaGraphRunner.execute.copy_to_static_buffers",
                                             reads=dict.fromkeys(_BATCH_READS),
                                             writes={"draft_graph.static_inputs": None}):
            pass
        with self._backend_steps():
            self.runner.execute(forward_batch, **kwargs)
        if self.last_output is None:
            raise RuntimeError("SGLang's draft-extend graph runner returned without replaying its graph")
        return self.last_output[: forward_batch.input_ids.shape[0]]

    def replay(self, run_once):
        """The graph's replay: SGLang's captured `run_once` over the static buffers, its in-graph metadata step one
        launch on the forward stream, the model's layer SGLang's backend `forward`, over the live batch padded to the
        replayed batch size as SGLang pads it."""
        mr = self.mr
        mr.bridge_delay()
        rows = self.runner.bs * self.width
        mr.replay_batch = pad_forward_batch(mr.live_batch, rows)
        try:
            output = run_once()
        finally:
            mr.replay_batch = None
        self.last_output = output.hidden_states[:, 0]
        logits = self.api.mods["logits"].LogitsProcessorOutput
        return logits(next_token_logits=torch.zeros((rows, 1), device=self.last_output.device),
                      hidden_states=output.hidden_states)

    def _note_replay(self, bucket: int, live: int) -> None:
        """The replay of batch size `bucket` for `live` requests, with how many padded requests `execute` left in the
        static buffers holding anything but what it pads them with in every release (request-pool row 0, the
        sequence-length fill value, output slot and position 0 for each token): read as the metadata plan is about to
        read them, after `execute`'s copies (on CUDA the read waits for the forward stream, where they were issued)."""
        buffers, width = self.runner.buffers, self.width
        requests, tokens = slice(live, bucket), slice(live * width, bucket * width)
        stale = ((buffers.req_pool_indices[requests] != 0)
                 | (buffers.seq_lens[requests] != self.runner.seq_len_fill_value)
                 | (buffers.out_cache_loc[tokens] != 0).view(-1, width).any(dim=1)
                 | (buffers.positions[tokens] != 0).view(-1, width).any(dim=1))
        # the session's probe: the draft runner's drops its records (`draft_runner._Unnoted`), this one is judged
        self.mr.session.probe.note(DraftGraphReplay(bucket=bucket, requests=live,
                                                    stale_padded_requests=int(stale.sum())))

    @contextlib.contextmanager
    def _backend_steps(self) -> Iterator[None]:
        """The backend's two metadata steps of a replay, where SGLang runs them: `init_forward_metadata_out_graph`
        (called by `execute` before the publish and the replay) as host work on the forward stream, and
        `init_forward_metadata_in_graph` (recorded in the graph) as the kernels it is, a launch on the forward
        stream binding the metadata it updates at issue. Both under the case's SGLang configuration."""
        backend, mr = self.mr.attn_backend, self.mr
        cls, dev, eager = type(backend), mr.harness_device, mr.eager

        def out_graph(forward_batch, in_capture: bool = False) -> None:
            # the rows of every request of the bucket (`build_page_table_positions` reads them all): the batch's, and
            # in a padded bucket the reserved slot 0 that SGLang's `execute` points padded requests at
            # (`req_pool_indices.zero_()`): padding that points elsewhere is an undeclared read
            live = mr.live_batch.req_pool_indices_cpu
            rows = frozenset(live) | (_PADDED_REQUEST_ROW if forward_batch.batch_size > len(live) else frozenset())
            reads = {"req_to_token": rows, **dict.fromkeys(_PLAN_READS)}
            if not in_capture:
                self._note_replay(forward_batch.batch_size, len(live))
            with dev.host_work("draft_DeepseekV4AttnBackend.init_forward_metadata_out_graph", reads=reads,
                               writes={"draft_meta": None}), eager.sglang():
                cls.init_forward_metadata_out_graph(backend, forward_batch, in_capture=in_capture)
            mr.plans.planned(PlanKind.METADATA, backend.forward_metadata)

        def in_graph(forward_batch) -> None:
            metadata = backend.forward_metadata

            def step():
                with eager.sglang(), eager.bound(metadata):
                    cls.init_forward_metadata_in_graph(backend, forward_batch)

            dev.launch("draft_DeepseekV4AttnBackend.init_forward_metadata_in_graph", step,
                       reads=dict.fromkeys(_PLAN_READS), writes={"draft_meta": None})

        replaced = {"init_forward_metadata_out_graph": out_graph, "init_forward_metadata_in_graph": in_graph}
        backend.__dict__.update(replaced)
        try:
            yield
        finally:
            for name in replaced:
                del backend.__dict__[name]


__all__ = ["SglangDraftExtendGraphRunner"]
