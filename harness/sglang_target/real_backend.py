"""SGLang's DSV4 attention backend and KV pool (every release, 0.5.19 to 0.5.23) as the sglang target runs them for
an eager EXTEND, DECODE or TARGET_VERIFY batch (and a breakable graph replay, `real_graph.py`):
built by their own `__init__`s over the session's tables, planned by the backend's own `init_forward_metadata`
and called per layer through its own `forward`; and the seams where the harness's model (everything above the
attention backend) meets them. `session.py` drives them on the harness's device.

What runs, all SGLang's own code (0.5.23 file: entry point; the PR-era releases have the same entry points, their
PR hook `prepare_prefill_shared_read_snapshot` in place of the resolver, and 0.5.19 to 0.5.21 decide sparse prefill
inline):

- `mem_cache/deepseek_v4_memory_pool.py`: `DeepSeekV4TokenToKVPool.__init__` (the SWA pool, the c4 / c128
  compressed pools, the indexer pool, the compress-state pools; with HiSparse the c4 pool is a
  `HiSparseC4DevicePool`, its `register_mapping` given the session's mapping), `register_mapping` (the session's
  full->SWA tensor itself), `set_swa_key_buffer_radix_fused`, `set_extra_key_buffer_fused` (the HiSparse pool's
  translates to device slots), every getter the backend reads;
- `mem_cache/memory_pool.py`: `ReqToTokenPool.__init__`, whose `req_to_token` is then re-bound to the session's
  table (the backend asserts at every init that it reads that very tensor);
- `configs/model_config.py`: `ModelConfig.from_server_args` of the published tiny server (`server.publish`);
- `layers/attention/deepseek_v4_backend.py`: `DeepseekV4AttnBackend.__init__`, `init_forward_metadata` and all
  it calls for a prefill (`_build_forward_metadata`, `init_forward_metadata_prefill`, `make_core_attn_metadata`,
  `init_forward_metadata_indexer`, `init_forward_metadata_in_graph`, the compressor plans), the resolver and
  its chunk-cache build, per layer `forward` -> `_forward_attention` -> `store_cache` -> `get_swa_out_cache_loc`,
  then `_forward_prefill_sparse` (its lazy `_build_sparse_prefill_chunk_cache` included) or the dense
  `flash_mla_with_kvcache` call; `layers/radix_attention.py`: `RadixAttention.__init__`, the `layer` argument;
- `layers/attention/dsv4/indexer.py`: `topk_transform_pytorch_vectorized`, the indexer's last step (top-k ->
  compressed-pool slots through the metadata's page table) as SGLang's torch top-k backend runs it, and with
  HiSparse outside a decode its translation of those slots (`translate_loc_to_hisparse_device`, the pool's).

Stood in, each because it cannot load here, in `flash_mla.py` and `jit_kernels.py` (each op with its source of
truth and a test against its contract): FlashMLA (`get_mla_metadata`, `flash_mla_sparse_fwd`,
`flash_mla_with_kvcache`) wherever its wheel does not load (on the GPU machine too: 0.5.23 imports it from the
sgl-flash-mla wheel, the PR-era releases from sglang-kernel's `sgl_kernel.flash_mla`); on a host
without a GPU the CUDA JIT KV store (`store.cuh`) and the CUDA JIT compressor planner (`c_plan.cuh`, each with the
installed release's loader arguments), with
`compress.py`'s pinned scratch unpinned (on a GPU SGLang's own JIT kernels compile and run).

Set, as SGLang's own server sets them on a GPU without DeepGEMM (`arg_groups/model_hook.py`, SM120):
`SGLANG_FP8_PAGED_MQA_LOGITS_TORCH=1` (no `deep_gemm` schedule in `PagedIndexerMetadata`) and
`SGLANG_OPT_USE_TOPK_V2=0` (no JIT top-k plan). On a host without CUDA, the three attributes 0.5.23's `__init__`
sets only under `is_cuda()` (`_swa_interleaved`, `_flash_mla_with_kvcache`, `_flashmla_split_kv_min_topk`) are set
the same way, from the same wrapper module, and the simulated device answers `get_device_capability` as the H200
it stands for while `__init__` runs (`simulated_capability`: 0.5.21 asks it unguarded).

DSV4's sizes are asserted by this code (page 256 in `__init__` and `PagedIndexerMetadata`, head_dim 512 in
`__init__`, index_topk 512 or 1024 in `init_flashmla_related`), so the target draws its cases at them
(`FIXED_DIMS`); its SWA window stays the case's (`platform.swa_window`: every reader of SGLang's `SWA_WINDOW` is in
the backend's module), but on 0.5.19 and 0.5.20, whose backend asserts its SWA page size (128) against it
(`Generation.swa_window`).

The harness's (above the backend): each layer's q and SWA latent k (projections, norm, RoPE), the compressed
latents a layer's compressor would produce and their write through the pool at SGLang's own locations (the
compressor's math and state ring are not run), the indexer's scores (the c4 top-k then goes through SGLang's
transform), and the KV history of the prefix (written through the pool, as an earlier forward would have).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import sys
from collections.abc import Iterator, Sequence
from types import MappingProxyType, SimpleNamespace
from typing import Optional

import torch

from harness.sglang_target import flash_mla, jit_kernels, server

PAGE_SIZE = 256  # the DSV4 backend asserts it
HEAD_DIM = 512
INDEX_TOPK = 512  # the tiny server's index_topk (server.TINY_DSV4)
FIXED_DIMS = MappingProxyType({"page_size": PAGE_SIZE, "head_dim": HEAD_DIM, "index_topk": INDEX_TOPK,
                               "kv_format": "fp8_v4"})
V4_ROW = jit_kernels.V4_DATA_BYTES  # bytes of one token's NoPE codes and RoPE values in a V4 page

_POOL = "sglang.srt.mem_cache.deepseek_v4_memory_pool"
_REQ_POOL = "sglang.srt.mem_cache.memory_pool"
_MODEL_CONFIG = "sglang.srt.configs.model_config"
_RADIX = "sglang.srt.layers.radix_attention"
_INDEXER = "sglang.srt.layers.attention.dsv4.indexer"
_FLASH_MLA_WRAPPER = "sglang.kernels.ops.attention.flash_mla_interface"
_NGRAM = "sglang.srt.model_executor.model_runner_components.ngram_embedding_manager"
_RAGGED = "sglang.srt.speculative.ragged_verify"
_DFLASH_INFO = "sglang.srt.speculative.dflash_info"

_prepared: list[str] = []


def _loads(api, package: str) -> bool:
    """A real `package` (FlashMLA's: `flash_mla` of the sgl-flash-mla wheel, or `sgl_kernel.flash_mla` of the
    sglang-kernel wheel) is importable here, and loads. Not where its wheel is a recording stand-in
    (`api.StandIns`: it did not load)."""
    top = package.split(".")[0]
    if top in api.stand_ins.reasons:
        return False
    present = sys.modules.get(package)
    if present is not None:
        stand_ins = (flash_mla, flash_mla.sgl_kernel_flash_mla)
        return getattr(present, "__file__", None) is not None and present not in stand_ins
    if importlib.util.find_spec(top) is None:
        return False
    try:
        importlib.import_module(package)
    except (ImportError, OSError):
        for name in [m for m in sys.modules if m == top or m.startswith(top + ".")]:
            del sys.modules[name]
        return False
    return True


def prepare(api) -> list[str]:
    """Once per process: the published server, the FlashMLA and JIT stand-ins. Returns what was stood in."""
    if not _prepared:
        server.publish(api, api.kernels_on.value)
        package = api.generation.flash_mla
        if not _loads(api, package):
            _prepared.extend(sorted(flash_mla.install(package)))
        _prepared.extend(jit_kernels.install())
        _prepared.append("(prepared)")
    return [name for name in _prepared if name != "(prepared)"]


def stand_in_rows(api) -> list[dict]:
    """What `prepare` stood in, as `summary.json`'s `stand_ins` rows (module, reason): each an implementation of
    the op's contract, tested against it (not a recorder like `api.StandIns`)."""

    def reason(name: str) -> str:
        if name.startswith("flash_mla"):
            return "compiled (sgl-flash-mla), not loadable here: its contract in harness/sglang_target/flash_mla.py"
        if name.startswith("sgl_kernel.flash_mla"):
            return "compiled (sglang-kernel), not loadable here: its contract in harness/sglang_target/flash_mla.py"
        if name.endswith(".torch"):
            return "its pinned host scratch needs a CUDA driver: allocated unpinned (harness/sglang_target/jit_kernels.py)"
        return "a CUDA JIT kernel, not buildable without a GPU: its .cuh contract in harness/sglang_target/jit_kernels.py"

    return [{"module": name, "reason": reason(name), "imported_by": []} for name in prepare(api)]


@contextlib.contextmanager
def switches(api, *, cp: bool = False) -> Iterator[None]:
    """SGLang's switches for a host without DeepGEMM and the JIT top-k planner (see the module's docstring), and the
    server's verify mode: `compact` (the ragged verify, DSpark's form for unequal lengths), `static` on a CP server
    (`cp`: SGLang refuses the ragged verify under CP)."""
    envs = api.mods["environ"].envs
    with envs.SGLANG_FP8_PAGED_MQA_LOGITS_TORCH.override(True), envs.SGLANG_OPT_USE_TOPK_V2.override(False), \
            envs.SGLANG_RAGGED_VERIFY_MODE.override("static" if cp else "compact"):
        yield


# The compute capability the CPU simulator answers for: the H200 (SM90) the harness's CUDA runs on.
SIMULATED_CAPABILITY = (9, 0)


@contextlib.contextmanager
def simulated_capability() -> Iterator[None]:
    """On a host without CUDA, `torch.cuda.get_device_capability()` answers the simulated device's (an SM90) while
    the backend's `__init__` runs: 0.5.21's `make_candidate_indexer` asks it unguarded (`is_sm100_or_newer`, which
    0.5.22 guards by `is_cuda()`), where a server always has a GPU. On a GPU host, the GPU's own."""
    if torch.cuda.is_available():
        yield
        return
    saved = torch.cuda.get_device_capability
    torch.cuda.get_device_capability = lambda device=None: SIMULATED_CAPABILITY
    try:
        yield
    finally:
        torch.cuda.get_device_capability = saved


def fixed_dims(api) -> MappingProxyType:
    """The `Dims` a release's cases run at: the sizes its backend asserts (DSV4's page size, head_dim and top-k,
    the SWA window where the release asserts that too, `Generation.swa_window`)."""
    window = api.generation.swa_window
    return FIXED_DIMS if window is None else MappingProxyType({**FIXED_DIMS, "swa_window": window})


class RealDsv4:
    """The real `DeepSeekV4TokenToKVPool`, `ReqToTokenPool` and `DeepseekV4AttnBackend`, built by their `__init__`s,
    reading the caller's `req_to_token` [rows, context] int32 and full->SWA mapping int64 (the very tensors: a
    mutation of them is what SGLang reads next). `draft_tokens`: the speculative server's draft width (the most
    tokens a verify batch has a request), None without speculative decoding. `full_size`: the full KV slots the
    caller's tables address; the compressed pools hold one entry per ratio block of them (c4 slot = full slot // 4,
    c128 slot = // 128). `draft`: a draft worker's pool and backend (`ModelRunner.is_draft_worker`, EAGLE's NextN
    model: `layer_ratios` (0,)), whose buffers are named `draft_swa_kv[layer]` beside the target's.
    `hisparse_map`: with HiSparse (`--enable-hisparse`), the logical c4 slot -> device c4 slot mapping the c4 pool
    translates through (`HiSparseC4DevicePool.register_mapping`; SGLang's allocator registers its
    `full_to_hisparse_device_index_mapping`), ending in the -1 that an invalid index (-1) reads; None without."""

    def __init__(self, api, *, req_to_token: torch.Tensor, full_to_swa: torch.Tensor, full_size: int,
                 swa_size: int, layer_ratios: Sequence[int], heads: int, spec_algorithm,
                 draft_tokens: Optional[int] = None, hisparse_map: Optional[torch.Tensor] = None,
                 draft: bool = False, device: str = "cpu"):
        if req_to_token.dtype != torch.int32 or full_to_swa.dtype != torch.int64:
            raise ValueError("req_to_token must be int32 and full_to_swa int64, as SGLang allocates them")
        if full_size % PAGE_SIZE:
            raise ValueError(f"full_size {full_size}: DSV4 allocates whole pages of {PAGE_SIZE}")
        self.api, self.layer_ratios = api, tuple(layer_ratios)
        self.prefix = "draft_" if draft else ""  # the declarations' names of this pool's buffers
        prepare(api)
        self.req_to_token, self.full_to_swa = req_to_token, full_to_swa
        self.pool = importlib.import_module(_POOL).DeepSeekV4TokenToKVPool(
            max_num_reqs=req_to_token.shape[0] - 1, swa_size=-(-swa_size // PAGE_SIZE) * PAGE_SIZE,
            c4_size=full_size // 4, c128_size=full_size // 128, c4_state_pool_size=swa_size,
            c128_state_pool_size=swa_size, page_size=PAGE_SIZE, swa_page_size=PAGE_SIZE, dtype=torch.float8_e4m3fn,
            c4_state_dtype=torch.float32, c128_state_dtype=torch.float32, qk_nope_head_dim=448, qk_rope_head_dim=64,
            indexer_head_dim=128, layer_num=len(self.layer_ratios), device=device, enable_memory_saver=False,
            compression_ratios=list(self.layer_ratios), enable_hisparse=hisparse_map is not None)
        self.pool.register_mapping(full_to_swa)
        self.hisparse = hisparse_map is not None and self.pool.c4_kv_pool is not None
        if self.hisparse:
            self.pool.c4_kv_pool.register_mapping(hisparse_map)
        self.req_to_token_pool = self._request_pool(req_to_token, device)
        server_args = api.mods["runtime"].get_context().server_args
        # What `DeepseekV4AttnBackend.__init__` reads of its model runner; `device` is the tensors' device (the
        # session's runner names the simulator's device module there). The model's context is the request table's
        # width, as a server sizes that table from it (`ReqToTokenPool(max_context_len=context_len + 4)`): the
        # prefill graph runner's start-up capture splits a bucket into requests of at most the context (0.5.19 and
        # 0.5.20 bound them by nothing else), and their rows must fit the table.
        model_config = importlib.import_module(_MODEL_CONFIG).ModelConfig.from_server_args(
            server_args, context_length=req_to_token.shape[1])
        runner = SimpleNamespace(
            device=device, model_config=model_config,
            page_size=PAGE_SIZE, req_to_token_pool=self.req_to_token_pool, token_to_kv_pool=self.pool,
            hisparse_coordinator=object() if hisparse_map is not None else None, spec_algorithm=spec_algorithm,
            is_draft_worker=draft,
            server_args=server_args)
        self.model_config = runner.model_config
        # The model runner's n-gram embedding manager, made by SGLang's `NgramEmbeddingManager.from_model` for a
        # model without n-gram embeddings (DSV4's config): off. The graph runner's capture reads it.
        self.ngram_embedding_manager = importlib.import_module(_NGRAM).NgramEmbeddingManager.from_model(
            model=torch.nn.Module(), model_config=self.model_config, req_to_token_pool=self.req_to_token_pool,
            max_running_requests=req_to_token.shape[0] - 1, device=device)
        # The server's --speculative-num-draft-tokens, which the backend reads at `__init__` (its verify buffers).
        with switches(api), api.mods["runtime"].get_spec().override(speculative_num_draft_tokens=draft_tokens), \
                simulated_capability():
            self.backend = api.backend_cls(runner)
        self._cuda_branch_attributes()
        radix = importlib.import_module(_RADIX).RadixAttention
        self.layers = [radix(heads, HEAD_DIM, HEAD_DIM ** -0.5, num_kv_heads=1, layer_id=i)
                       for i in range(len(self.layer_ratios))]
        assert self.backend.req_to_token is req_to_token
        assert self.pool.full_to_swa_index_mapping is full_to_swa

    def _request_pool(self, req_to_token: torch.Tensor, device: str):
        """SGLang's ReqToTokenPool of the same shape, its table re-bound to the caller's (as the scheduler shares it)."""
        rows = req_to_token.shape[0]
        pool = importlib.import_module(_REQ_POOL).ReqToTokenPool(
            size=rows - 1, max_context_len=req_to_token.shape[1], device=device, enable_memory_saver=False)
        if tuple(pool.req_to_token.shape) != tuple(req_to_token.shape):
            raise ValueError(f"req_to_token {tuple(req_to_token.shape)}: SGLang's pool of {rows - 1} requests has "
                             f"{tuple(pool.req_to_token.shape)}")
        pool.req_to_token = req_to_token
        return pool

    def _cuda_branch_attributes(self) -> None:
        """0.5.23's `DeepseekV4AttnBackend.__init__` sets these only under `is_cuda()`; on a CPU host, the same
        values. (The PR-era `__init__` sets none: their forward imports FlashMLA where it calls it.)"""
        backend = self.backend
        if hasattr(backend, "_flash_mla_with_kvcache") or self.api.generation.flash_mla != "flash_mla":
            return
        wrapper = importlib.import_module(_FLASH_MLA_WRAPPER)
        backend._swa_interleaved = self.pool.get_swa_key_layout().is_interleaved
        backend._flash_mla_with_kvcache = functools.partial(wrapper.flash_mla_with_kvcache,
                                                            use_legacy=not backend._swa_interleaved)
        backend._flashmla_split_kv_min_topk = wrapper.SPLIT_KV_MIN_TOPK

    @staticmethod
    def verify_input(*, verify_lens: Sequence[int], committed_lens: torch.Tensor, input_ids: torch.Tensor,
                     positions: torch.Tensor):
        """A target-verify batch's `spec_info` as DSpark's verify step hands it (`dspark_verify._run_ragged`): a
        `DFlashVerifyInput` carrying the `RaggedVerifyLayout` of the per-request verify lengths (SGLang's only
        form for unequal lengths; the backend plans it under `SGLANG_RAGGED_VERIFY_MODE=compact`), eager, so the
        layout's token count is the batch's own (`graph_num_tokens`). `committed_lens`: the host lengths before the
        verify tokens (`live_seq_lens_cpu`)."""
        lens = [int(n) for n in verify_lens]
        layout = importlib.import_module(_RAGGED).RaggedVerifyLayout.from_verify_lens(
            verify_lens_cpu=lens, device=input_ids.device, grid=[sum(lens)])
        return importlib.import_module(_DFLASH_INFO).DFlashVerifyInput(
            draft_token=input_ids, positions=positions, draft_token_num=max(lens), ragged_verify_layout=layout,
            live_seq_lens_cpu=committed_lens)

    @staticmethod
    def static_verify_input(*, width: int, committed_lens: torch.Tensor, input_ids: torch.Tensor,
                            positions: torch.Tensor):
        """A target-verify batch's `spec_info` as DSpark's static verify hands it (`dspark_verify.run_non_compact`,
        what a CP server runs: SGLang refuses the ragged verify under CP): a `DFlashVerifyInput` of `width` tokens a
        request and no ragged layout, so the backend plans the uniform verify. `committed_lens`: the host lengths
        before the verify tokens (`live_seq_lens_cpu`)."""
        return importlib.import_module(_DFLASH_INFO).DFlashVerifyInput(
            draft_token=input_ids, positions=positions, draft_token_num=width, custom_mask=None,
            live_seq_lens_cpu=committed_lens)

    def eagle_verify_input(self, *, width: int, committed_lens: torch.Tensor, input_ids: torch.Tensor,
                           positions: torch.Tensor):
        """A target-verify batch's `spec_info` as EAGLE's worker hands it (`EAGLEWorkerV2.verify`): the drafted
        chain's `EagleVerifyInput`, every request the server's `width` draft tokens, and no ragged layout, so the
        backend plans the uniform verify (`speculative_num_draft_tokens` tokens a request). One chain (top-k 1,
        `width - 1` draft steps); the tree's retrieve indices and mask serve the accept step after the forward,
        which reads neither. `committed_lens`: the host lengths before the verify tokens."""
        return self.api.mods["eagle_info"].EagleVerifyInput(
            draft_token=input_ids, custom_mask=None, positions=positions, retrieve_index=None,
            retrieve_next_token=None, retrieve_next_sibling=None, retrieve_cum_len=None, spec_steps=width - 1, topk=1,
            draft_token_num=width, capture_hidden_mode=self.api.mods["forward"].CaptureHiddenMode.NULL,
            seq_lens_sum=int(committed_lens.sum()), seq_lens_cpu=committed_lens)

    # -- the KV buffers, by the names the harness's declarations use -------------------------------------

    def swa_buffer(self, layer_id: int) -> torch.Tensor:
        """The layer's SWA cache as the backend reads it: [pages, page bytes] of one-byte elements, V4 layout."""
        return self.pool.get_swa_key_buffer_radix(layer_id)

    def extra_buffer(self, layer_id: int) -> torch.Tensor:
        """The layer's compressed cache (a ratio-4 or ratio-128 layer), as `swa_buffer`."""
        return self.pool.get_extra_key_buffer(layer_id)

    def buffers(self) -> dict[str, torch.Tensor]:
        """Every KV buffer the forward writes or reads, as `swa_kv[layer]` and `extra_kv[layer]` (after `prefix`)."""
        named = {f"{self.prefix}swa_kv[{layer}]": self.swa_buffer(layer) for layer in range(len(self.layer_ratios))}
        named.update({f"{self.prefix}extra_kv[{layer}]": self.extra_buffer(layer)
                      for layer, ratio in enumerate(self.layer_ratios) if ratio})
        return named

    # -- the harness's writes: KV history, compressed latents ------------------------------------------
    # Nothing to store stores nothing, as SGLang's compressor returns before its store when no block completes
    # (`compressor_v2`: `if kv_to_store.shape[0] == 0: return`): 0.5.19's and 0.5.20's store kernel launches an
    # empty grid for no rows, which CUDA refuses (invalid argument); 0.5.21 on returns first.

    def write_swa(self, layer_id: int, swa_loc: torch.Tensor, k: torch.Tensor) -> None:
        """Latents [n, 512] at SWA slots `swa_loc`, through the pool's own fused store (an earlier forward's KV)."""
        if swa_loc.numel():
            self.pool.set_swa_key_buffer_radix_fused(layer_id=layer_id, swa_loc=swa_loc,
                                                     cache_k=k.to(torch.bfloat16))

    def write_compressed(self, layer_id: int, loc: torch.Tensor, latent: torch.Tensor) -> None:
        """Compressed latents [n, 512] at compressed-pool slots `loc`, through the pool's own store."""
        if loc.numel():
            self.pool.set_extra_key_buffer_fused(layer_id=layer_id, loc=loc, cache_k=latent.to(torch.bfloat16))

    def compressor_writes(self, ratio: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Where this batch's compressor writes for `ratio`, as SGLang's compressor takes it (its HIP path,
        `_forward_unified_hip` step 4): the token rows of the prefill plan's CompressPlans (`ragged_id`), or of a
        decode plan the rows whose token completes a block (SGLang stores every decode row, the others zeroed at
        their out_loc 0, the dummy slot), and the metadata's `c{ratio}_out_loc` at those rows. Returns (rows, loc)."""
        backend = self.backend
        plan = backend._get_paged_compress_metadata(ratio)
        fields = plan[1].view(torch.int32)
        if plan.is_decode:  # a DecodePlan per request: its token completes a block where seq_len % ratio == 0
            rows = torch.nonzero(fields[:, 0] % ratio == 0).view(-1)
        else:
            rows = (fields[:, 1] & 0xFFFF).long()
        return rows, backend._get_out_loc(ratio)[rows]

    def c4_top_k(self, metadata, scores: torch.Tensor, device_indices: Optional[torch.Tensor] = None) -> None:
        """The indexer's last step for the c4 layers, as `forward_c4_indexer` runs it with the torch top-k
        backend: `topk_transform_pytorch_vectorized` over the harness's scores [rows, >= max c4 length] writes
        `metadata`'s `c4_sparse_page_indices` and `c4_sparse_raw_indices` in place; with HiSparse, then its branch
        for a batch that is not a decode (the target never runs a decode of a HiSparse case here: that branch swaps
        pages in through the HiSparse coordinator), the page indices re-bound to their device slots; in a graph's
        replay (`device_indices`: the tensor the capture re-bound them to) the translation written there, as the
        captured kernel writes its recorded output."""
        indexer = importlib.import_module(_INDEXER)
        core, index = metadata.core_attn_metadata, metadata.indexer_metadata
        rows = scores.shape[0]
        if hasattr(indexer, "topk_transform_pytorch_vectorized"):
            transform, lens, page_size = (indexer.topk_transform_pytorch_vectorized, index.compressed_seq_lens,
                                          index.compressed_page_size)
        else:  # 0.5.19's names for the same transform and fields (0.5.20 renamed them for any compressed ratio)
            transform, lens, page_size = (indexer.topk_transform_512_pytorch_vectorized, index.c4_seq_lens,
                                          index.c4_page_size)
        transform(scores, lens[:rows], index.page_table[:rows], core.c4_sparse_page_indices[:rows], page_size,
                  None if core.c4_sparse_raw_indices is None else core.c4_sparse_raw_indices[:rows])  # decode keeps none
        if not self.hisparse:
            return
        # the indexer's HiSparse step outside decode: the page indices to device slots
        translated = self.pool.c4_kv_pool.translate_loc_to_hisparse_device(core.c4_sparse_page_indices).to(torch.int32)
        if device_indices is None:
            core.c4_sparse_page_indices = translated
        else:
            device_indices.copy_(translated)

    # -- readers for the oracles ---------------------------------------------------------------------

    def read_swa(self) -> torch.Tensor:
        """Every SWA slot of every layer, decoded: float32 [layers, slots, 512]."""
        page = self.pool.swa_kv_pool.page_size  # `get_swa_key_page_size()` from 0.5.22, the same without a window
        return torch.stack([read_v4(self.swa_buffer(layer), page) for layer in range(len(self.layer_ratios))])

    def read_compressed(self, full_size: int, c4_device_slots: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Every compressed entry of every layer, decoded, in the harness's layout: slot `s` of a ratio-`r` layer
        at row `r * s`, the full slot of its block's first token, for the `full_size // r` slots the tables
        address; the pool's slots beyond those (its reserved page) after row `full_size`, in order, where no
        batch owns anything. `c4_device_slots`: with HiSparse, the device slot each logical c4 slot was allocated
        (int64 [full_size // 4]): a c4 layer's slot `s` is read there. float32 [layers, full_size + the most such
        slots, 512]."""
        decoded = {layer: read_v4(self.extra_buffer(layer), self.pool.get_extra_key_page_size(layer))
                   for layer, ratio in enumerate(self.layer_ratios) if ratio}
        if self.hisparse:
            decoded.update({layer: torch.cat([values[c4_device_slots], values[full_size // 4:]])
                            for layer, values in decoded.items() if self.layer_ratios[layer] == 4})
        beyond = {layer: values[full_size // self.layer_ratios[layer]:] for layer, values in decoded.items()}
        out = torch.zeros(len(self.layer_ratios), full_size + max([0] + [v.shape[0] for v in beyond.values()]),
                          HEAD_DIM, device=self.full_to_swa.device)
        for layer, values in decoded.items():
            ratio = self.layer_ratios[layer]
            out[layer, :full_size:ratio] = values[: full_size // ratio]
            out[layer, full_size: full_size + beyond[layer].shape[0]] = beyond[layer]
        return out


def read_v4(cache: torch.Tensor, page_size: int) -> torch.Tensor:
    """A V4 page buffer ([pages, page bytes] of one-byte elements, `jit_kernels.fused_store_flashmla_v4`'s layout)
    decoded:
    float32 [pages * page_size, 512], NoPE code times 2^(ue8m0 - 127) of its tile, RoPE as stored (an unwritten
    slot, all zero bytes, reads as zeros). The harness's
    reader (SGLang's `dequantize_k_cache_paged_dsv4`, interpreted, would cost seconds per pool); tested against it."""
    cache = cache.view(torch.uint8)  # the pool hands its pages out as float8 codes; the scales are bytes
    pages = cache.shape[0]
    data = cache[:, : page_size * V4_ROW].reshape(pages * page_size, V4_ROW)
    scale_at = page_size * V4_ROW
    exps = cache[:, scale_at: scale_at + page_size * jit_kernels.V4_SCALE_BYTES]
    exps = exps.reshape(pages * page_size, jit_kernels.V4_SCALE_BYTES)[:, : jit_kernels.V4_TILES]
    codes = data[:, : jit_kernels.V4_NOPE].contiguous().view(torch.float8_e4m3fn).float()
    scale = (exps.to(torch.int32) << 23).view(torch.float32)  # 2^(e - 127), exact; 0 for an unwritten slot's 0
    nope = (codes.view(-1, jit_kernels.V4_TILES, jit_kernels.V4_TILE) * scale[..., None]).flatten(1)
    rope = data[:, jit_kernels.V4_NOPE:].contiguous().view(torch.bfloat16).float()
    return torch.cat([nope, rope], dim=1)


__all__ = ["FIXED_DIMS", "HEAD_DIM", "PAGE_SIZE", "RealDsv4", "fixed_dims", "prepare", "read_v4", "stand_in_rows",
           "switches"]
