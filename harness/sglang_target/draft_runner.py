"""EAGLE's draft model runner of `--target sglang` (`SglangDraftRunner`): SGLang's draft worker's pool, backend and
eager runner over the session's tables, for the draft extend after a prefill and for a draft-extend batch
(`DRAFT_EXTEND_V2`, eager or replayed by SGLang's draft-extend graph runner, `draft_graph.py`)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Optional

import torch

from harness.case import Case
from harness.model.enums import ForwardMode as HForwardMode
from harness.model.pools import ForwardBatch
from harness.sglang_target.draft_graph import SglangDraftExtendGraphRunner
from harness.sglang_target.model_runner import SglangModelRunner
from harness.targets import ReferenceSession  # the owning SglangSession's base (session.py imports this)


class _Unnoted:
    """A draft runner's probe: its dispatch, snapshot, forward and fallback records are dropped. The oracles judge
    the target's publication from them; a draft runner never publishes (`maybe_publish_prefill_shared_read_done`
    refuses every algorithm with a draft extend) and its own decisions would read as a second forward of the batch.
    Its plans are noted (the session's `Plans`: the freshness oracle judges what its forward reads)."""

    @staticmethod
    def note(record) -> None:
        del record


class SglangDraftRunner(SglangModelRunner):
    """EAGLE's draft model runner (`EAGLEWorkerV2.draft_runner`: a `ModelRunner` with `is_draft_worker`) for
    DSV4's NextN model, one SWA-only attention layer (`deepseek_v4_nextn.COMPRESS_RATIO_NEXTN_LAYER`, 0): SGLang's
    own pool and backend, built by their `__init__`s over the session's tables (a draft worker shares the target's
    request pool and KV allocator, so the same `req_to_token` and full->SWA mapping), and SGLang's own eager runner.
    The harness's NextN layer takes the target's first layer's inputs (its q, SWA latent and sink), so the reference
    model's draft extend (`run_speculative_tail`: window attention over the first layer's SWA latents) is what it
    must compute; its SWA history is the first layer's.

    Two batches run it: the draft extend after a prefill (`draft_extend`, eager: SGLang captures a draft's
    breakable graph only for `force_for_draft_worker`, not modelled), and the draft extend after a verify or
    draft-extend batch of the server's draft width (`DRAFT_EXTEND_V2`, `draft_extend_v2`), through SGLang's
    draft-extend CUDA graph runner where the batch replays (`draft_graph`) and eagerly otherwise."""

    is_draft_worker = True
    canary_manager = None  # what the draft-extend runner's capture asks of its model runner

    def __init__(self, session: ReferenceSession, target: SglangModelRunner):
        super().__init__(session, probe=_Unnoted(), plans=target.plans)
        self.width = self._draft_tokens()  # the server's draft tokens per request, fixed for the case
        self.extend_graph_runner = self._build_extend_graph_runner()

    def model_layer_ratios(self) -> tuple[int, ...]:
        return (0,)

    def _build_graph_runner(self) -> None:
        return None

    def _draft_tokens(self) -> Optional[int]:
        """The server's `--speculative-num-draft-tokens` as the draft backend reads it: the case's draft-extend width
        (`draft_extend_width`) where it has draft-extend batches, else the target's (its verify batches')."""
        width = draft_extend_width(self.case)
        return width if width is not None else super()._draft_tokens()

    def extends_over(self, fb: ForwardBatch) -> bool:
        """Whether SGLang's worker extends its draft over this batch as a `DRAFT_EXTEND_V2` batch of this runner."""
        return runs_sglangs_draft_extend(fb.forward_mode, fb.extend_seq_lens_cpu, self.width)

    def _build_extend_graph_runner(self) -> Optional[SglangDraftExtendGraphRunner]:
        """SGLang's draft-extend graph runner, capturing the batch sizes (of SGLang's speculative capture list) the
        case's replayed draft extends pad to; None when no batch replays one, or where the server turns the graph
        off (`SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH`, read as `EagleDraftWorker._capture_cuda_graphs` reads it: each
        draft extend then runs eagerly, as `_draft_extend_for_decode` runs it without a graph runner)."""
        sizes = [len(b.requests) for b in self.case.batches
                 if b.graph and runs_sglangs_draft_extend(b.mode, [r.extend_len for r in b.requests], self.width)]
        if not sizes or self.api.mods["environ"].envs.SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH.get():
            return None
        capture_list = self.api.mods["buckets"].generate_decode_cuda_graph_batch_sizes(
            SimpleNamespace(disable_cuda_graph_padding=False, speculative_algorithm=self.case.spec.name),
            self.session.sizes.max_reqs)
        pad = self.api.mods["base_graph_runner"].BaseCudaGraphRunner._pad_to_bucket
        return SglangDraftExtendGraphRunner(self, width=self.width,
                                            batch_sizes=sorted({pad(bs, capture_list) for bs in sizes}))

    def draft_extend(self, fb: ForwardBatch) -> torch.Tensor:
        """`EAGLEWorkerV2._draft_extend_for_prefill`'s forward: the target's prefill batch, as an EXTEND batch of the
        draft runner (SGLang's eager runner, the backend's metadata init, resolver and forward). [rows, heads, 512]."""
        return self.forward(fb, graph=False)[0]

    def draft_extend_v2(self, fb: ForwardBatch, *, graph: bool) -> torch.Tensor:
        """`EAGLEWorkerV2._draft_extend_for_decode`'s forward over a verify or draft-extend batch: the batch as
        `prepare_for_draft_extend` makes it (every request `width` tokens, `seq_lens` past them, the window's write
        locations), then SGLang's draft-extend graph runner where `can_run_graph` lets it, else the backend's metadata
        init (marked ready, as `prepare_for_draft_extend` does) and the draft runner's eager forward. [rows, heads,
        512]."""
        mods = self.api.mods
        batch = self.sglang_batch(fb, mode=mods["forward"].ForwardMode.DRAFT_EXTEND_V2)
        accepted = torch.full((fb.batch_size,), self.width, dtype=torch.int32, device=fb.seq_lens.device)
        batch.spec_info = mods["eagle_info"].EagleDraftExtendInput(
            hidden_states=None, num_correct_drafts=accepted - 1, num_accept_tokens=accepted,
            num_tokens_per_req=self.width, positions=fb.positions)
        self.live_batch = fb
        self.real_batch = self.ran_real = True
        contexts = self.api.mods["forward_context"]
        batch_kwargs = {"forward_batch": batch} if self.api.generation.context_takes_batch else {}
        try:
            with contexts.forward_context(contexts.ForwardContext(attn_backend=self.attn_backend), **batch_kwargs):
                runner = self.extend_graph_runner
                if graph and runner is not None and runner.can_run_graph(batch):
                    return runner.execute(batch)
                self.eager.init_forward_metadata(batch)
                batch.mark_forward_metadata_ready()
                return self.eager_runner.execute(batch).hidden_states[:, 0]
        finally:
            self.live_batch, self.real_batch = None, False


def draft_extend_width(case: Case) -> Optional[int]:
    """The tokens per request of the case's first draft-extend batch whose requests all have the same count (the
    server's `--speculative-num-draft-tokens`: `prepare_for_draft_extend` gives every request that many); None
    without one."""
    for b in case.batches:
        widths = {r.extend_len for r in b.requests}
        if b.mode is HForwardMode.DRAFT_EXTEND and len(widths) == 1:
            return widths.pop()
    return None


def runs_sglangs_draft_extend(mode: HForwardMode, lengths, width: Optional[int]) -> bool:
    """Whether the draft extend after a batch of `mode` whose requests extend by `lengths` is a `DRAFT_EXTEND_V2` batch
    SGLang's draft runner runs: a verify or draft-extend batch, every request the server's `width` tokens
    (`prepare_for_draft_extend` extends each by `speculative_num_draft_tokens`). Any other is the harness's tail."""
    return mode.is_draft_wide() and width is not None and bool(lengths) and set(lengths) == {width}


__all__ = ["SglangDraftRunner", "draft_extend_width", "runs_sglangs_draft_extend"]
