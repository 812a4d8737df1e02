"""`--target reference`: the in-repo model of the DSV4 prefill path behind the protocol
(`harness.targets.protocol`), and its replaceable parts (`Classes`), which a seeded bug swaps."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from harness.case import Case
from harness.model.pools import DSV4TokenToKVPool, ForwardBatch, ReqToTokenPool, to_device
from harness.model.runners import ModelRunner
from harness.model.scheduler import Scheduler
from harness.probe import Probe
from harness.targets.protocol import Target
from harness.world import BatchWorld, PoolSizes, kv_contents


@dataclass
class Classes:
    """The reference's replaceable parts: a seeded bug swaps exactly one of them."""

    model_runner: type = ModelRunner
    scheduler: type = Scheduler


class ReferenceSession:
    def __init__(self, case: Case, device, classes: Classes):
        self.case, self.device = case, device
        self.sizes = sizes = PoolSizes.for_case(case)
        dims, tdev = case.dims, device.torch_device
        self.probe = Probe()
        layers = len(dims.layer_ratios)
        self.req_to_token_pool = ReqToTokenPool(sizes.max_reqs, sizes.max_context, tdev)
        self.token_to_kv_pool = DSV4TokenToKVPool(sizes.full_size(dims.page_size), dims.page_size, sizes.swa_size,
                                                  layers, dims.head_dim, dims.index_dim, tdev)
        self.sink = torch.zeros(layers, dims.heads, device=tdev)
        self.model_runner = classes.model_runner(
            device=device, flags=case.flags, semantics=case.semantics, spec_algorithm=case.spec, dims=dims,
            req_to_token_pool=self.req_to_token_pool, token_to_kv_pool=self.token_to_kv_pool, sink=self.sink,
            probe=self.probe, graph_contract=case.graph_contract)
        self.scheduler = classes.scheduler(device, self.model_runner, case.flags)

    @property
    def req_to_token(self) -> torch.Tensor:
        return self.req_to_token_pool.req_to_token

    @property
    def full_to_swa(self) -> torch.Tensor:
        return self.token_to_kv_pool.full_to_swa_index_mapping

    @property
    def full_to_hisparse(self) -> torch.Tensor:
        return self.token_to_kv_pool.full_to_hisparse

    def load(self, world: BatchWorld) -> ForwardBatch:
        """The scheduler's allocation for this batch, written in place (graphs keep the pool tensors)."""
        self.device.synchronize()
        tdev = self.device.torch_device
        pool, r2t = self.token_to_kv_pool, self.req_to_token
        plan = load_plan(world)
        r2t.zero_()
        pool.full_to_swa_index_mapping[:-1] = 0
        pool.full_to_hisparse.copy_(torch.arange(pool.size, device=tdev))
        for store in (pool.swa_kv, pool.extra_kv, pool.indexer_k):
            store.zero_()
        for row, slots in zip(world.req_pool_idx, plan.full_slots, strict=True):
            r2t[row, : len(slots)] = slots.to(r2t.dtype)
        pool.full_to_swa_index_mapping[plan.live_full_slots] = plan.live_swa_slots
        for name, (index, values) in kv_contents(world, after_forward=False).items():
            getattr(pool, name)[index] = values
        self.sink.copy_(world.sink)
        return make_forward_batch(world, self.case, tdev)

    def step(self, fb, *, graph, process_batch_result, after_launch):
        return self.scheduler.event_loop_step(fb, graph=graph, process_batch_result=process_batch_result,
                                              after_launch=after_launch)

    def kv_state(self) -> dict[str, torch.Tensor]:
        pool = self.token_to_kv_pool
        return {"swa_kv": pool.swa_kv, "extra_kv": pool.extra_kv, "indexer_k": pool.indexer_k}


@dataclass(frozen=True)
class LoadPlan:
    """A world's slots on its device, for the load's writes (one copy from the host, then slices)."""

    full_slots: tuple[torch.Tensor, ...]  # per request, its full slot per position
    live_full_slots: torch.Tensor  # the full slots whose token is in the SWA window...
    live_swa_slots: torch.Tensor  # ...and the SWA slot each maps to


def load_plan(world: BatchWorld) -> LoadPlan:
    """Built once per world: both runs of a case load the same slots."""
    if "load_plan" not in world.derived:
        full = [torch.tensor(slots, dtype=torch.int64) for slots in world.full_slots]
        swa = [torch.tensor(slots, dtype=torch.int64) for slots in world.swa_slots]
        live = [s > 0 for s in swa]  # selected on the host: a mask on the GPU would synchronise it
        parts = [*full, *(f[m] for f, m in zip(full, live)), *(s[m] for s, m in zip(swa, live))]
        on_device = to_device(torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64), world.device)
        pieces = on_device.split([len(p) for p in parts]) if parts else ()
        n = len(full)
        world.derived["load_plan"] = LoadPlan(
            full_slots=tuple(pieces[:n]),
            live_full_slots=torch.cat(pieces[n:2 * n]) if n else on_device,
            live_swa_slots=torch.cat(pieces[2 * n:]) if n else on_device)
    return world.derived["load_plan"]


def make_forward_batch(world: BatchWorld, case: Case, tdev) -> ForwardBatch:
    """The batch's tensors: derived once per world, and copied for each run (a target may write to its
    batch; the world serves both runs of the case)."""
    if "forward_inputs" not in world.derived:
        world.derived["forward_inputs"] = _forward_inputs(world)
    inputs = world.derived["forward_inputs"]
    batch, reqs = world.batch, world.batch.requests
    copies = {name: t.to(tdev, copy=True) for name, t in inputs.items()}
    return ForwardBatch(
        forward_mode=batch.mode, spec_algorithm=case.spec, batch_size=len(reqs),
        seq_lens_cpu=[r.seq_len for r in reqs], extend_seq_lens_cpu=[r.extend_len for r in reqs],
        req_pool_indices_cpu=list(world.req_pool_idx), row_req=[r for r, _ in world.token_rows], **copies)


def _forward_inputs(world: BatchWorld) -> dict[str, torch.Tensor]:
    """The forward batch's tensors on the world's device; the host's integers go there in two copies."""
    dims, reqs, device = world.dims, world.batch.requests, world.device
    layers, t = len(dims.layer_ratios), world.num_tokens
    positions = [pos for _, pos in world.token_rows]
    out_loc = [world.full_slots[r][pos] for r, pos in world.token_rows]
    # Where each completed compressed block lands: per (layer, request), the batch rows and the blocks.
    completed, start = [], 0
    for r, req in enumerate(reqs):
        pos = torch.arange(req.prefix_len, req.seq_len)
        for layer, ratio in enumerate(dims.layer_ratios):
            done = ((pos + 1) % ratio == 0).nonzero().flatten() if ratio else pos[:0]
            if done.numel():
                completed.append((layer, ratio, r, start + done, (pos[done] + 1) // ratio - 1))
        start += req.extend_len
    wide = [torch.tensor(positions + out_loc, dtype=torch.int64)]
    for *_, rows_at, blocks in completed:
        wide += [rows_at, blocks]
    wide = to_device(torch.cat(wide), device).split([len(w) for w in wide])
    narrow = to_device(torch.tensor(
        list(world.req_pool_idx) + [r.seq_len for r in reqs] + [r.extend_len for r in reqs]
        + list(itertools.accumulate([r.extend_len for r in reqs], initial=0))[:-1], dtype=torch.int32),
        device).view(4, len(reqs))
    compressed_new = torch.zeros(layers, t, dims.head_dim, device=device)
    index_k_new = torch.zeros(t, dims.index_dim, device=device)
    for (layer, ratio, r, _, _), rows_at, blocks in zip(completed, wide[1::2], wide[2::2], strict=True):
        compressed_new[layer, rows_at] = world.block_means(r, layer, ratio)[blocks]
        if ratio == 4:
            index_k_new[rows_at] = world.index_keys[r][blocks]
    kv_new = torch.cat([world.latents[r][:, req.prefix_len:req.seq_len] for r, req in enumerate(reqs)], dim=1) \
        if reqs else torch.zeros(layers, 0, dims.head_dim, device=device)
    return {"req_pool_indices": narrow[0], "seq_lens": narrow[1], "extend_seq_lens": narrow[2],
            "extend_start_loc": narrow[3], "positions": wide[0][:t], "out_cache_loc": wide[0][t:],
            "input_ids": torch.arange(t, device=device), "q": world.q, "kv_new": kv_new,
            "compressed_new": compressed_new, "index_k_new": index_k_new, "q_index": world.q_index}


class ReferenceTarget(Target):
    """The in-repo model; `classes` swaps in a seeded bug."""

    semantics_supported = ("0.5.23", "pr")

    def __init__(self, classes: Classes | None = None, name: str = "reference"):
        self.classes = classes or Classes()
        self.name = name

    def open(self, case: Case, device) -> ReferenceSession:
        return ReferenceSession(case, device, self.classes)
