"""`--target reference`: the in-repo model of the DSV4 prefill path behind the protocol
(`harness.targets.protocol`), and its replaceable parts (`Classes`), which a seeded bug swaps."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.case import Case
from harness.model.pools import DSV4TokenToKVPool, ForwardBatch, ReqToTokenPool
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
        r2t.zero_()
        pool.full_to_swa_index_mapping[:-1] = 0
        pool.full_to_hisparse.copy_(torch.arange(pool.size, device=tdev))
        for store in (pool.swa_kv, pool.extra_kv, pool.indexer_k):
            store.zero_()
        for r, row in enumerate(world.req_pool_idx):
            slots = torch.tensor(world.full_slots[r], dtype=torch.int64)
            r2t[row, : len(slots)] = slots.to(r2t.dtype).to(tdev)
            swa = torch.tensor(world.swa_slots[r], dtype=torch.int64)
            live = swa > 0  # selected on the host: a mask on the GPU would synchronise it
            pool.full_to_swa_index_mapping[slots[live].to(tdev)] = swa[live].to(tdev)
        for name, (index, values) in kv_contents(world, after_forward=False).items():
            getattr(pool, name)[tuple(i.to(tdev) for i in index)] = values.to(tdev)
        self.sink.copy_(world.sink)
        return make_forward_batch(world, self.case, tdev)

    def step(self, fb, *, graph, process_batch_result, after_launch):
        return self.scheduler.event_loop_step(fb, graph=graph, process_batch_result=process_batch_result,
                                              after_launch=after_launch)

    def kv_state(self) -> dict[str, torch.Tensor]:
        pool = self.token_to_kv_pool
        return {"swa_kv": pool.swa_kv, "extra_kv": pool.extra_kv, "indexer_k": pool.indexer_k}


def make_forward_batch(world: BatchWorld, case: Case, tdev) -> ForwardBatch:
    batch, dims = world.batch, world.dims
    reqs = batch.requests
    i32 = dict(dtype=torch.int32, device=tdev)
    positions = [p for r in reqs for p in range(r.prefix_len, r.seq_len)]
    out_loc = [world.full_slots[i][p] for i, r in enumerate(reqs) for p in range(r.prefix_len, r.seq_len)]
    rows = world.token_rows
    layers, t = len(dims.layer_ratios), world.num_tokens
    # The world's tensors serve both runs of the case: everything here is a new tensor on the target's device.
    compressed_new = torch.zeros(layers, t, dims.head_dim, device=tdev)
    index_k_new = torch.zeros(t, dims.index_dim, device=tdev)
    start = 0
    for r, req in enumerate(reqs):
        pos = torch.arange(req.prefix_len, req.seq_len)  # host-side positions: no device synchronisation
        for layer, ratio in enumerate(dims.layer_ratios):
            if not ratio:
                continue
            done = ((pos + 1) % ratio == 0).nonzero().flatten()
            rows_at, blocks = (start + done).to(tdev), ((pos[done] + 1) // ratio - 1).to(world.device)
            compressed_new[layer, rows_at] = world.block_means(r, layer, ratio)[blocks].to(tdev)
            if ratio == 4:
                index_k_new[rows_at] = world.index_keys[r][blocks].to(tdev)
        start += req.extend_len
    kv_new = torch.cat([world.latents[r][:, req.prefix_len:req.seq_len] for r, req in enumerate(reqs)], dim=1) \
        if reqs else torch.zeros(layers, 0, dims.head_dim, device=tdev)
    return ForwardBatch(
        forward_mode=batch.mode, spec_algorithm=case.spec, batch_size=len(reqs),
        req_pool_indices=torch.tensor(world.req_pool_idx, **i32),
        seq_lens=torch.tensor([r.seq_len for r in reqs], **i32), seq_lens_cpu=[r.seq_len for r in reqs],
        extend_seq_lens=torch.tensor([r.extend_len for r in reqs], **i32),
        extend_seq_lens_cpu=[r.extend_len for r in reqs],
        extend_start_loc=torch.tensor(([0] + list(_prefix_sums([r.extend_len for r in reqs])))[:-1], **i32),
        positions=torch.tensor(positions, dtype=torch.int64, device=tdev),
        out_cache_loc=torch.tensor(out_loc, dtype=torch.int64, device=tdev),
        input_ids=torch.arange(t, device=tdev),
        req_pool_indices_cpu=list(world.req_pool_idx),
        q=world.q.to(tdev, copy=True), kv_new=kv_new.to(tdev), compressed_new=compressed_new,
        index_k_new=index_k_new, q_index=world.q_index.to(tdev, copy=True),
        row_req=[r for r, _ in rows],
    )


def _prefix_sums(values):
    total = 0
    for v in values:
        total += v
        yield total


class ReferenceTarget(Target):
    """The in-repo model; `classes` swaps in a seeded bug."""

    semantics_supported = ("0.5.23", "pr")

    def __init__(self, classes: Classes | None = None, name: str = "reference"):
        self.classes = classes or Classes()
        self.name = name

    def open(self, case: Case, device) -> ReferenceSession:
        return ReferenceSession(case, device, self.classes)
