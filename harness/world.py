"""The scheduler's side of a case, made concrete: pool sizes, slot allocations and the model's data.

A target materialises its pools from this plan; the float64 oracle computes the expected attention
directly from it (positions and latents), never through the index machinery it checks.

The model's data (latents, queries, sinks, indexer keys) is drawn on the device the case runs on,
from a counter-based generator (`draw_uniform`, `draw_integers`): each value is a hash of its seed
and its position, computed with integer operations that give the same bits on the CPU and on CUDA,
so a seed means the same data on every device and a replay on the other device is exact. Torch's
own generators cannot promise that (the CPU's Mersenne Twister and CUDA's Philox differ), and
drawing on the CPU for a GPU case cost most of a real-size case's time. Slot plans (which pages and
rows a request owns) are small host-side lists, drawn on the CPU as before.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from functools import cached_property

import torch

from harness.case import FP8_V4_NOPE, Batch, Case, Dims
from harness.device import DeviceKind
from harness.model.pools import to_device

SPARE_ROWS = 4  # pool rows no request of the batch uses: targets of "other" rewrites and of reuse
SPARE_PAGES = 4


def gather_len(req, window: int) -> int:
    """SGLang: the SWA span a request's queries read, min(seq_len, extend + W - 1)."""
    return min(req.seq_len, req.extend_len + window - 1)


_MASK32 = 0xFFFFFFFF
# Odd multipliers below 2**31 (Wellons's lowbias32 first constant; MurmurHash2's m): a 32-bit value times
# one stays below 2**63, so int64 arithmetic is exact and no device's overflow behaviour is involved.
_MULTIPLIERS = ((0x7FEB352D, 16), (0x5BD1E995, 15))
_DRAW_CHUNK = 1 << 18  # values hashed at once on the CPU: the int64 temporaries stay in cache


def _stream_key(seed: int, stream: int) -> int:
    """A 32-bit key for one tensor of one world: splitmix64 of (seed, stream), in Python integers."""
    z = (seed * 0x9E3779B97F4A7C15 + stream * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) & _MASK32


def _hashed(shape, seed: int, stream: int, device, finish) -> torch.Tensor:
    """`finish(h)` of the 32-bit hashes h of positions 0..n-1 under the (seed, stream) key, shaped `shape`;
    in chunks on the CPU (where each pass over a large int64 tensor would go to memory), at once on a GPU."""
    n, key = math.prod(shape), _stream_key(seed, stream)
    chunk = _DRAW_CHUNK if DeviceKind.of(device) is DeviceKind.CPU else max(1, n)
    parts = []
    for start in range(0, max(1, n), chunk):  # n == 0 (no indexer block yet) draws one empty chunk
        x = torch.arange(start, min(n, start + chunk), dtype=torch.int64, device=device)
        x.bitwise_xor_(key)
        for multiplier, shift in _MULTIPLIERS:
            x.bitwise_xor_(x >> shift).mul_(multiplier).bitwise_and_(_MASK32)
        x.bitwise_xor_(x >> 16)
        parts.append(finish(x))
    return (torch.cat(parts) if len(parts) != 1 else parts[0]).reshape(shape)


def draw_uniform(shape, seed: int, stream: int, device="cpu") -> torch.Tensor:
    """float32 values uniform on [-2, 2) in steps of 2**-21 (mean 0, variance 4/3): exact dyadic
    values, so the conversion and the scaling are exact on every device."""
    return _hashed(shape, seed, stream, device, lambda h: ((h >> 9) - (1 << 22)).float().mul_(2.0 ** -21))


def held_by_kv_format(latents: torch.Tensor, kv_format: str) -> torch.Tensor:
    """Latents [..., D] as the case's KV cache holds them exactly. "float32": unchanged. "fp8_v4": the 448
    NoPE values rounded to quarters (|k / 4| <= 2: at most 4 significant bits, so whatever power-of-two
    scale DSV4's store picks for a tile, value / scale is an e4m3 number) and the 64 RoPE values rounded to
    bf16, so SGLang's FP8 cache returns exactly what was stored and a float64 reference of the same values
    judges the attention, not the quantization. Both roundings give the same bits on every device."""
    if kv_format == "float32":
        return latents
    nope, rope = latents[..., :FP8_V4_NOPE], latents[..., FP8_V4_NOPE:]
    return torch.cat([torch.round(nope * 4).clamp_(-8, 8).div_(4), rope.to(torch.bfloat16).float()], dim=-1)


def held_by_queries(q: torch.Tensor, kv_format: str) -> torch.Tensor:
    """Queries as the attention takes them: bf16 values where the KV cache is DSV4's (its kernels take bf16
    queries), else unchanged."""
    return q if kv_format == "float32" else q.to(torch.bfloat16).float()


def draw_integers(shape, low: int, high: int, seed: int, stream: int, device="cpu") -> torch.Tensor:
    """float32 integers in [low, high), from the same hash (the indexer's small integer keys)."""
    return _hashed(shape, seed, stream, device, lambda h: (h % (high - low) + low).float())


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
    """Everything one batch needs: host-side slot plans, and the model's data on the case's device.
    One world serves both runs of a case, so a target copies what it loads and never writes to it."""

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
    # Tensors derived from the world once and then shared by its runs, which never write them: the block
    # means, the KV contents (`kv_contents`) and what a target builds from the world every run (its
    # load's index tensors, its forward batch's inputs), by name.
    derived: dict = field(default_factory=dict, repr=False)

    @property
    def num_tokens(self) -> int:
        return self.batch.num_tokens

    @cached_property
    def token_rows(self) -> tuple[tuple[int, int], ...]:
        """(request index, position) for every query row, in batch order."""
        return tuple((r, pos) for r, req in enumerate(self.batch.requests) for pos in range(req.prefix_len, req.seq_len))

    @property
    def device(self) -> torch.device:
        return self.q.device

    def block_means(self, r: int, layer: int, ratio: int) -> torch.Tensor:
        """Compressed entries [seq_len // ratio, D]: a block's mean latent (the compressor is not modelled), as
        the case's KV cache holds it (`held_by_kv_format`)."""
        key = ("block_means", r, layer, ratio)
        if key not in self.derived:
            n = self.batch.requests[r].seq_len // ratio
            means = self.latents[r][layer, : n * ratio].reshape(n, ratio, self.dims.head_dim).mean(dim=1)
            self.derived[key] = held_by_kv_format(means, self.dims.kv_format)
        return self.derived[key]


def build_world(case: Case, index: int, sizes: PoolSizes, device="cpu") -> BatchWorld:
    """Batch `index` of `case`; the model's data drawn on `device` (the same values on every device)."""
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
    # One stream number per tensor: 0 queries, 1 indexer queries, 2 sinks, then two per request.
    latents = [held_by_kv_format(draw_uniform((layers, req.seq_len, dims.head_dim), seed, 3 + 2 * r, device),
                                 dims.kv_format) for r, req in enumerate(batch.requests)]
    index_keys = [draw_integers((req.seq_len // 4, dims.index_dim), -4, 5, seed, 4 + 2 * r, device)
                  for r, req in enumerate(batch.requests)]
    t = batch.num_tokens
    world = BatchWorld(
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
        q=held_by_queries(draw_uniform((layers, t, dims.heads, dims.head_dim), seed, 0, device), dims.kv_format),
        q_index=draw_integers((t, dims.index_dim), -4, 5, seed, 1, device),
        sink=draw_uniform((layers, dims.heads), seed, 2, device),
        seed=seed,
    )
    if DeviceKind.of(world.device) is DeviceKind.CUDA:
        # Drawn on the current stream; a target loads it on its own streams, which do not wait for
        # this one: the draw is finished before any of them can read it.
        torch.cuda.current_stream().synchronize()
    return world


def kv_contents(world: BatchWorld, *, after_forward: bool) -> dict[str, tuple[tuple[torch.Tensor, ...], torch.Tensor]]:
    """The KV entries the pools hold before the forward (prefix) or after it (prefix and extend).

    Per cache: (index tensors, values) such that ``cache[index] = values`` writes them; the SWA and
    compressed caches are indexed by (layer, slot), the indexer cache by slot. Built once per world
    (the load of each run and the kv oracle ask for them); the caller never writes to them.
    """
    key = ("kv_contents", after_forward)
    if key not in world.derived:
        world.derived[key] = _kv_contents(world, after_forward=after_forward)
    return world.derived[key]


def _kv_contents(world: BatchWorld, *, after_forward: bool) -> dict[str, tuple[tuple[torch.Tensor, ...], torch.Tensor]]:
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
            swa_val.append(world.latents[r][:, to_device(live, world.device)].flatten(0, 1))
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
        """Index tensors and values on the world's device: indexing a GPU pool with CPU indices would
        copy them there one by one, each copy a synchronisation."""
        if not idx:
            empty = tuple(torch.zeros(0, dtype=torch.int64, device=world.device) for _ in range(dims_))
            return empty, torch.zeros(0, width, device=world.device)
        index = to_device(torch.cat(idx, dim=-1), world.device)
        return (tuple(index) if dims_ == 2 else (index,)), torch.cat(val)

    return {"swa_kv": pack(swa_idx, swa_val, 2, dims.head_dim),
            "extra_kv": pack(ext_idx, ext_val, 2, dims.head_dim),
            "indexer_k": pack(ind_idx, ind_val, 1, dims.index_dim)}


class CaseWorlds:
    """A case's batch worlds, each built the first time a run asks for it and then shared: the
    overlapped and the barriered run (and every interleaving an exploration forces) load the same
    data, drawn once. `seconds`: the time spent drawing them."""

    def __init__(self, case: Case):
        self.case, self.sizes = case, PoolSizes.for_case(case)
        self._built: dict[int, BatchWorld] = {}
        self.seconds = 0.0

    def __getitem__(self, key: tuple[int, torch.device]) -> BatchWorld:
        index, device = key
        world = self._built.get(index)
        if world is None:
            began = time.perf_counter()
            world = self._built[index] = build_world(self.case, index, self.sizes, device)
            self.seconds += time.perf_counter() - began
        elif not same_device(world.device, torch.device(device)):
            raise ValueError(f"batch {index}'s world is on {world.device}, asked for on {device}")
        return world


def same_device(a: torch.device, b: torch.device) -> bool:
    """Whether two devices are one: a tensor's device carries its index (`cuda:0`), the device a run asks
    for often does not (`cuda`, the current one). A run uses one GPU (workers are pinned to theirs), so
    a device without an index is the one with any index of its type."""
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)
