"""The scheduler's side of a case, made concrete: pool sizes, slot allocations and the model's data.

A target materialises its pools from this plan; the float64 oracle computes the expected attention
directly from it (positions and latents), never through the index machinery it checks.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from harness.case import Batch, Case, Dims

SPARE_ROWS = 4  # pool rows no request of the batch uses: targets of "other" rewrites and of reuse
SPARE_PAGES = 4


def gather_len(req, window: int) -> int:
    """SGLang: the SWA span a request's queries read, min(seq_len, extend + W - 1)."""
    return min(req.seq_len, req.extend_len + window - 1)


@dataclass(frozen=True)
class PoolSizes:
    max_reqs: int
    max_context: int
    full_pages: int
    swa_size: int

    @staticmethod
    def for_case(case: Case) -> "PoolSizes":
        dims = case.dims
        ps = dims.page_size
        max_reqs = max(len(b.requests) for b in case.batches) + SPARE_ROWS + 1
        max_context = max([r.seq_len for b in case.batches for r in b.requests] + [1])
        max_context = -(-max_context // ps) * ps
        pages = max(sum(-(-r.seq_len // ps) for r in b.requests) for b in case.batches)
        full_pages = pages + SPARE_PAGES * max(1, -(-max_context // ps)) + 1
        swa = max(sum(gather_len(r, dims.swa_window) for r in b.requests) for b in case.batches)
        return PoolSizes(max_reqs, max_context, full_pages, 2 * swa + dims.swa_window + 2)

    def full_size(self, page_size: int) -> int:
        return self.full_pages * page_size


@dataclass
class BatchWorld:
    """Everything one batch needs, on the CPU; targets copy it to their device."""

    batch: Batch
    dims: Dims
    sizes: PoolSizes
    req_pool_idx: list[int]
    full_slots: list[list[int]]  # per request, per position
    swa_slots: list[list[int]]  # per request, per position; 0 when the token left the window
    spare_rows: list[int]
    spare_pages: list[int]
    spare_swa: list[int]
    latents: list[torch.Tensor]  # per request [layers, seq_len, D]
    index_keys: list[torch.Tensor]  # per request [seq_len // 4, index_dim], small integers
    q: torch.Tensor  # [layers, T, H, D]
    q_index: torch.Tensor  # [T, index_dim], small integers
    sink: torch.Tensor  # [layers, H]
    seed: int
    _blocks: dict = field(default_factory=dict, repr=False)

    @property
    def num_tokens(self) -> int:
        return self.batch.num_tokens

    def token_rows(self):
        """(request index, position) for every query row, in batch order."""
        for r, req in enumerate(self.batch.requests):
            for pos in range(req.prefix_len, req.seq_len):
                yield r, pos

    def block_means(self, r: int, layer: int, ratio: int) -> torch.Tensor:
        """Compressed entries [seq_len // ratio, D]: a block's mean latent (the compressor is not modelled)."""
        key = (r, layer, ratio)
        if key not in self._blocks:
            n = self.batch.requests[r].seq_len // ratio
            self._blocks[key] = self.latents[r][layer, : n * ratio].reshape(n, ratio, self.dims.head_dim).mean(dim=1)
        return self._blocks[key]


def build_world(case: Case, index: int, sizes: PoolSizes) -> BatchWorld:
    batch, dims = case.batches[index], case.dims
    seed = case.data_seed * 1009 + index
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    ps = dims.page_size
    n = len(batch.requests)

    rows = list(range(1, sizes.max_reqs))
    rng.shuffle(rows)
    req_pool_idx, spare_rows = rows[:n], rows[n:]

    pages = (torch.randperm(sizes.full_pages - 1, generator=gen) + 1).tolist()  # page 0: the dummy slot 0
    full_slots = []
    for req in batch.requests:
        own = [pages.pop() for _ in range(-(-req.seq_len // ps))]
        full_slots.append([own[p // ps] * ps + p % ps for p in range(req.seq_len)])

    swa_free = (torch.randperm(sizes.swa_size - 1, generator=gen) + 1).tolist()  # SWA slot 0 is the dummy
    swa_slots = []
    for req in batch.requests:
        first = req.seq_len - gather_len(req, dims.swa_window)
        swa_slots.append([swa_free.pop() if p >= first else 0 for p in range(req.seq_len)])

    layers = len(dims.layer_ratios)
    latents = [torch.randn(layers, req.seq_len, dims.head_dim, generator=gen) for req in batch.requests]
    index_keys = [
        torch.randint(-4, 5, (req.seq_len // 4, dims.index_dim), generator=gen).float() for req in batch.requests
    ]
    t = batch.num_tokens
    return BatchWorld(
        batch=batch,
        dims=dims,
        sizes=sizes,
        req_pool_idx=req_pool_idx,
        full_slots=full_slots,
        swa_slots=swa_slots,
        spare_rows=spare_rows,
        spare_pages=pages,
        spare_swa=swa_free,
        latents=latents,
        index_keys=index_keys,
        q=torch.randn(layers, t, dims.heads, dims.head_dim, generator=gen),
        q_index=torch.randint(-4, 5, (t, dims.index_dim), generator=gen).float(),
        sink=torch.randn(layers, dims.heads, generator=gen),
        seed=seed,
    )


def kv_contents(world: BatchWorld, *, after_forward: bool) -> dict[str, tuple[tuple[torch.Tensor, ...], torch.Tensor]]:
    """The KV entries the pools hold before the forward (prefix) or after it (prefix and extend).

    Per cache: (index tensors, values) such that ``cache[index] = values`` writes them; the SWA and
    compressed caches are indexed by (layer, slot), the indexer cache by slot.
    """
    dims = world.dims
    layers = len(dims.layer_ratios)
    swa_idx, swa_val, ext_idx, ext_val, ind_idx, ind_val = [], [], [], [], [], []
    for r, req in enumerate(world.batch.requests):
        end = req.seq_len if after_forward else req.prefix_len
        slots = torch.tensor(world.swa_slots[r][:end], dtype=torch.int64)
        live = slots.nonzero().flatten()
        if live.numel():
            swa_idx.append(torch.stack(torch.broadcast_tensors(torch.arange(layers)[:, None], slots[live][None, :]))
                           .flatten(1))
            swa_val.append(world.latents[r][:, live].flatten(0, 1))
        full = torch.tensor(world.full_slots[r], dtype=torch.int64)
        for layer, ratio in enumerate(dims.layer_ratios):
            blocks = end // ratio if ratio else 0
            if not blocks:
                continue
            starts = full[torch.arange(blocks) * ratio]
            ext_idx.append(torch.stack([torch.full((blocks,), layer), starts]))
            ext_val.append(world.block_means(r, layer, ratio)[:blocks])
            if ratio == 4 and layer == dims.layer_ratios.index(4):
                ind_idx.append(starts)
                ind_val.append(world.index_keys[r][:blocks])

    def pack(idx, val, dims_, width):
        if not idx:
            empty = tuple(torch.zeros(0, dtype=torch.int64) for _ in range(dims_))
            return empty, torch.zeros(0, width)
        index = torch.cat(idx, dim=-1)
        return (tuple(index) if dims_ == 2 else (index,)), torch.cat(val)

    return {"swa_kv": pack(swa_idx, swa_val, 2, dims.head_dim),
            "extra_kv": pack(ext_idx, ext_val, 2, dims.head_dim),
            "indexer_k": pack(ind_idx, ind_val, 1, dims.index_dim)}
