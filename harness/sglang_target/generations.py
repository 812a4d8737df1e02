"""The API generations of SGLang's DSV4 prefill path, one record each, chosen once from the installed package.

Every released sglang with this path (0.5.19 to 0.5.23) is one of three generations. They share the runners,
the publisher's module, the scheduler's barrier and the metadata classes by name; they differ in how the
runners hand the backend its snapshot, in the chunk cache's API and in a few helpers' homes:

- `resolver` (0.5.23): the runners call `resolve_prefill_shared_read_ends`, which returns the read end
  (`SharedReadEnds.PRE_REPLAY` once `_snapshot_prefill_shared_reads` built the chunk cache); the publisher
  takes that read end; the chunk cache has `layer_inputs` / `ensure_compressed` / `combine_compressed` over a
  `SparsePrefillKVBuffer`; the SWA kernels' wrappers live in the kernels module.
- `pr-late` (0.5.21, 0.5.22): PR #35947's hook `prepare_prefill_shared_read_snapshot`, which marks the
  metadata (`prefill_shared_reads_snapshotted`) and returns nothing; the publisher takes the forward batch and
  asks `shared_read_ends`; the hook returns at once for a pool with a request window; the chunk cache as
  0.5.23's over a `SparsePrefillWorkspace`, its build given the core metadata.
- `pr-early` (0.5.19, 0.5.20): the hook as the seed quotes it; the chunk cache's compressed API is
  `ensure_c4` / `combine_c4_layer`, its build takes the forward batch only.

A generation is recognised by the names only it has (`markers`); every other name it needs is checked by
`api.load_api`, and a missing one is named there (exit 3).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from harness.semantics import Semantics

BACKEND = "sglang.srt.layers.attention.deepseek_v4_backend"
BASE_BACKEND = "sglang.srt.layers.attention.base_attn_backend"
SPARSE_UTILS = "sglang.srt.layers.attention.dsv4.sparse_prefill_utils"
KERNELS = "sglang.kernels.ops.attention.dsv4.sparse_prefill_kernels"
SPEC = "sglang.srt.speculative.spec_info"
GRAPH_RUNNER = "sglang.srt.model_executor.runner.prefill_cuda_graph_runner"
SHAPE_KEY = "sglang.srt.model_executor.runner.shape_key"
BUFFER_REGISTRY = "sglang.srt.model_executor.cuda_graph_buffer_registry"
INPUT_BUFFERS = "sglang.srt.model_executor.input_buffers"  # the process-wide pool of graph input buffers
BREAKABLE_BACKEND = "sglang.srt.model_executor.runner_backend.breakable_cuda_graph_backend"
GRAPH_CONFIG = "sglang.srt.model_executor.cuda_graph_config"
KV_TRANSLATOR = "sglang.srt.mem_cache.kv_index_translator"
MODEL = "sglang.srt.models.deepseek_v4"  # DSV4's model: its graph attention op calls the backend's forward
# the prefill graph runner's forward context (named for tc_piecewise; the breakable graph's eager segments read it)
TC_CONTEXT = "sglang.srt.model_executor.runner_backend_utils.tc_piecewise_cuda_graph.context_manager"


@dataclass(frozen=True)
class Generation:
    """What the sglang target needs to know of one API generation."""

    name: str
    semantics: Semantics  # the reference model's semantics of the same design
    detail: str
    markers: tuple[tuple[str, str], ...]  # (module, dotted attribute) only this generation has
    names: tuple[tuple[str, str], ...]  # what else this generation must have
    hook: str  # the backend method the runners call between metadata init and the publish
    swa_kernels_module: str  # where `build_swa_token_ids` / `combine_topk_swa_indices` are defined
    build_takes_core: bool  # `_build_sparse_prefill_chunk_cache(fb, core_attn_metadata, *, num_qo_tokens)`
    compressed_api: str  # "compressed": ensure_compressed / combine_compressed / layer_inputs; "c4": ensure_c4 ...
    context_takes_batch: bool  # `forward_context(ctx, forward_batch=...)`, as `ModelRunner._forward_raw` enters it
    runs_cp: bool  # a CP batch runs in one process: the model owns the CP layout (CP-TP group sharing)
    stores_stashed_chunk: bool  # with LMCache, the next step's stash stores the chunk just prefilled
    # Where the backend imports FlashMLA from: 0.5.23 through its wrapper of the `flash_mla` package (the
    # sgl-flash-mla wheel), the PR-era releases from `sgl_kernel.flash_mla` (the sglang-kernel wheel).
    flash_mla: str = "sgl_kernel.flash_mla"
    # The SWA window the backend asserts, so its cases run at it: 0.5.19's `make_core_attn_metadata` asserts that
    # its SWA page size (128) is SWA_WINDOW, 0.5.20's `_build_forward_metadata` that it is a multiple. None: the case's window (the
    # harness sets SWA_WINDOW to it, `platform.swa_window`).
    swa_window: Optional[int] = None

    @property
    def publishes_from_read_end(self) -> bool:
        """The publisher takes the resolved read end (0.5.23), not the forward batch (PR-era)."""
        return self.semantics.resolves_read_ends


RESOLVER = Generation(
    name="resolver", semantics=Semantics.V0_5_23,
    detail="0.5.23 resolver (resolve_prefill_shared_read_ends + _snapshot_prefill_shared_reads)",
    markers=((BASE_BACKEND, "AttentionBackend.resolve_prefill_shared_read_ends"),
             (BACKEND, "DeepseekV4AttnBackend._snapshot_prefill_shared_reads")),
    names=((SPEC, "SpeculativeAlgorithm.supports_prefill_shared_read_done"),
           (BACKEND, "DeepseekV4AttnBackend._use_sparse_prefill"),
           (SPARSE_UTILS, "SparsePrefillChunkCache.ensure_compressed"),
           (SPARSE_UTILS, "SparsePrefillChunkCache.combine_compressed"),
           (SPARSE_UTILS, "SparsePrefillChunkCache.layer_inputs"), (SPARSE_UTILS, "SparsePrefillKVBuffer"),
           (KERNELS, "build_swa_token_ids"), (KERNELS, "combine_topk_swa_indices"),
           (KV_TRANSLATOR, "KVIndexTranslator.own_plan")),
    hook="resolve_prefill_shared_read_ends",
    swa_kernels_module=KERNELS, build_takes_core=True, compressed_api="compressed",
    context_takes_batch=True, runs_cp=True,
    stores_stashed_chunk=True, flash_mla="flash_mla")

PR_LATE = Generation(
    name="pr-late", semantics=Semantics.PR,
    detail="PR-era hook (prepare_prefill_shared_read_snapshot + prefill_shared_reads_snapshotted), "
           "0.5.21 form (request-window early return, compressed chunk-cache API)",
    markers=((BACKEND, "DeepseekV4AttnBackend.prepare_prefill_shared_read_snapshot"),
             (SPARSE_UTILS, "SparsePrefillChunkCache.ensure_compressed")),
    names=((BASE_BACKEND, "AttentionBackend.prepare_prefill_shared_read_snapshot"),
           (SPARSE_UTILS, "SparsePrefillChunkCache.combine_compressed"),
           (SPARSE_UTILS, "SparsePrefillChunkCache.layer_inputs"), (SPARSE_UTILS, "SparsePrefillWorkspace"),
           (SPARSE_UTILS, "build_swa_token_ids"), (SPARSE_UTILS, "combine_topk_swa_indices")),
    hook="prepare_prefill_shared_read_snapshot",
    swa_kernels_module=SPARSE_UTILS, build_takes_core=True, compressed_api="compressed",
    context_takes_batch=False, runs_cp=False,
    stores_stashed_chunk=True)

PR_EARLY = Generation(
    name="pr-early", semantics=Semantics.PR,
    detail="PR-era hook (prepare_prefill_shared_read_snapshot + prefill_shared_reads_snapshotted), "
           "0.5.19 form (the seed's hook, ensure_c4 chunk-cache API)",
    markers=((BACKEND, "DeepseekV4AttnBackend.prepare_prefill_shared_read_snapshot"),
             (SPARSE_UTILS, "SparsePrefillChunkCache.ensure_c4")),
    names=((BASE_BACKEND, "AttentionBackend.prepare_prefill_shared_read_snapshot"),
           (SPARSE_UTILS, "SparsePrefillChunkCache.combine_c4_layer"), (SPARSE_UTILS, "SparsePrefillWorkspace"),
           (SPARSE_UTILS, "build_swa_token_ids"), (SPARSE_UTILS, "combine_topk_swa_indices")),
    hook="prepare_prefill_shared_read_snapshot",
    swa_kernels_module=SPARSE_UTILS, build_takes_core=False, compressed_api="c4",
    context_takes_batch=False, runs_cp=False,
    stores_stashed_chunk=False, swa_window=128)

GENERATIONS = (RESOLVER, PR_LATE, PR_EARLY)
# The generation of each release on PyPI, read in its wheel (`recognise` is what decides for an installed one).
RELEASED = {"0.5.19": PR_EARLY, "0.5.20": PR_EARLY, "0.5.21": PR_LATE, "0.5.22": PR_LATE, "0.5.23": RESOLVER}


def recognise(has) -> Optional[Generation]:
    """The generation whose markers the installed package has (`has(module, dotted)`), or None."""
    for generation in GENERATIONS:
        if all(has(module, dotted) for module, dotted in generation.markers):
            return generation
    return None
