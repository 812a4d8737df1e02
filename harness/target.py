"""The protocol every system under test implements, and the in-repo reference behind it.

A target opens one session per case run. The session owns the pools and the worker; the harness
loads each batch into it, lets it run one overlap-loop iteration, and reads back what it produced.
Point the harness at your own build with ``--target module:factory`` where ``factory()`` returns an
object with ``name``, ``semantics_supported`` and ``open(case, device)``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch

from harness.case import Case
from harness.errors import EnvironmentBroken, InvalidArgument
from harness.model.pools import DSV4TokenToKVPool, ForwardBatch, ReqToTokenPool
from harness.model.runners import ModelRunner
from harness.model.scheduler import Scheduler
from harness.world import BatchWorld, PoolSizes, kv_contents


@dataclass
class Probe:
    """What the system under test reports about its own decisions, read by the policy oracle."""

    notes: list[tuple[str, dict]] = field(default_factory=list)

    def note(self, kind: str, **data) -> None:
        self.notes.append((kind, data))

    def take(self) -> list[tuple[str, dict]]:
        notes, self.notes = self.notes, []
        return notes


class Session(Protocol):
    probe: Probe
    req_to_token: torch.Tensor
    full_to_swa: torch.Tensor
    full_to_hisparse: torch.Tensor

    def load(self, world: BatchWorld) -> ForwardBatch: ...

    def step(self, fb: ForwardBatch, *, graph: bool, process_batch_result: Callable[[], None],
             after_launch: Callable[[], None]) -> dict[str, torch.Tensor]: ...

    def kv_state(self) -> dict[str, torch.Tensor]: ...


class Target(Protocol):
    name: str

    def open(self, case: Case, device) -> Session: ...


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


def load_batch(session: Session, device, world: BatchWorld) -> ForwardBatch:
    """A batch's inputs loaded on the forward stream, so they are ordered before the forward reads them:
    on torch's default stream they would not be (PyTorch's streams do not wait for it; under racecheck's
    slowness SGLang's kernel once read the tables before the load had written them)."""
    with device.stream(device.forward_stream):
        return session.load(world)


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


class ReferenceTarget:
    """The in-repo model; `classes` swaps in a seeded bug."""

    def __init__(self, classes: Classes | None = None, name: str = "reference"):
        self.classes = classes or Classes()
        self.name = name

    def open(self, case: Case, device) -> ReferenceSession:
        return ReferenceSession(case, device, self.classes)


# The built-in `--target` names, as `module:factory` strings resolved like any other: the target module
# never imports the targets built on it (the sglang target, the seeded bugs), so they sit above it.
BUILTIN_TARGETS = {"reference": "harness.target:ReferenceTarget", "sglang": "harness.sglang_target:make_target"}
MUTANT_FACTORY = "harness.mutants:mutant_target"  # --mutant NAME: the reference with one seeded bug


def _resolve(spec: str, shown: str) -> Callable:
    """The callable a `module:factory` string names; `shown` is the --target value in the messages."""
    module_name, sep, factory_name = spec.partition(":")
    if not sep or not module_name or not factory_name:
        raise InvalidArgument(f"--target={shown!r} is not one of: {', '.join(BUILTIN_TARGETS)}, MODULE:FACTORY")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise EnvironmentBroken(f"--target {shown}: cannot import {module_name!r} ({exc})") from None
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise InvalidArgument(f"--target {shown}: {module_name!r} has no callable {factory_name!r}")
    return factory


def load_target(spec: str, *, mutant: str | None = None) -> Target:
    """`reference`, `sglang` (the names of BUILTIN_TARGETS), or `module:factory`."""
    if mutant is not None:
        if spec != "reference":
            raise InvalidArgument(f"--mutant applies to --target reference only, not {spec!r}")
        return _resolve(MUTANT_FACTORY, spec)(mutant)
    if spec in BUILTIN_TARGETS:
        return _resolve(BUILTIN_TARGETS[spec], spec)()
    target = _resolve(spec, spec)()
    if not callable(getattr(target, "open", None)):
        raise InvalidArgument(f"--target {spec}: the factory's result has no open(case, device) method")
    return target
