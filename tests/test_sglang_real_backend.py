"""`harness/sglang_target/real_backend.py`: SGLang 0.5.23's real `DeepseekV4AttnBackend` on the real
`DeepSeekV4TokenToKVPool`, built by their `__init__`s, planned by the real `init_forward_metadata` and run per
layer through the real `forward`, judged against a float64 reference computed from positions and the bf16
latents the test wrote. The latents are exactly representable in the V4 FP8 cache (NoPE values k/4 with
|k| <= 8, so each tile's power-of-two scale divides them exactly; RoPE bf16), so the pool round trip is lossless:
checked bit for bit through SGLang's own dequantizer, and `read_v4` (the harness's reader) against it.

Also: the JIT stand-ins (`jit_kernels.py`) against references written from their `.cuh` contracts and, for
the store, against SGLang's own Triton port of the same kernel. (The session's use of all this, case by case,
is tested in tests/test_sglang_target.py.)

Run in the sglang env with TRITON_INTERPRET=1 (set here when no GPU is visible). Timing:
`python tests/test_sglang_real_backend.py --timing`.
"""

from __future__ import annotations

import importlib
import inspect
import math
import sys
import time
from dataclasses import dataclass, field

from harness.sglang_target.api import prepare_triton

prepare_triton()

import pytest

pytest.importorskip("sglang", reason="the sglang package is not installed")

import torch

from harness.sglang_target import jit_kernels
from harness.sglang_target import real_backend as rb
from harness.sglang_target.real_backend import RealDsv4, read_v4, switches

PAGE = rb.PAGE_SIZE
WINDOW = 128  # SGLang's own SWA_WINDOW: these tests leave it as it is
SCALE = rb.HEAD_DIM ** -0.5


@dataclass(frozen=True)
class Request:
    """One request of the batch: its `req_to_token` row, the tokens already cached and the tokens extended."""

    row: int
    prefix: int
    extend: int

    @property
    def seq_len(self) -> int:
        return self.prefix + self.extend


@pytest.fixture(scope="module")
def api():
    from harness.sglang_target.api import load_api

    api = load_api()
    if api.kernels_on != "cpu":
        pytest.skip("the prototype's tests run SGLang's Triton kernels interpreted (TRITON_INTERPRET=1)")
    yield api
    jit_kernels.uninstall()
    rb._prepared.clear()


# -- the harness's world: tables, latents, the float64 reference ------------------------------------------------

def latent(n: int, g: torch.Generator) -> torch.Tensor:
    """[n, 512] bf16, exact in the V4 FP8 cache: NoPE values k/4 (|k| <= 8: 3 significant bits, and each
    tile's scale is a power of two at least amax/448), RoPE any bf16."""
    nope = torch.randint(-8, 9, (n, 448), generator=g).float() / 4
    return torch.cat([nope, torch.randn(n, 64, generator=g)], dim=1).to(torch.bfloat16)


@dataclass
class World:
    """What the harness (the scheduler above SGLang) owns: req_to_token, the full->SWA mapping, and per layer
    the latents of every position of every request (the prefix ones already in the cache), the compressed
    latents per ratio block, and the extend tokens' queries."""

    requests: list
    ratios: tuple
    heads: int = 2
    seed: int = 0
    req_to_token: torch.Tensor = None
    full_to_swa: torch.Tensor = None
    k: dict = field(default_factory=dict)  # (layer, request index) -> [seq_len, 512]
    comp: dict = field(default_factory=dict)  # (layer, request index) -> [seq_len // ratio, 512]
    q: dict = field(default_factory=dict)  # layer -> [tokens, heads, 512]
    sink: dict = field(default_factory=dict)  # layer -> [heads]

    def __post_init__(self):
        g = torch.Generator().manual_seed(self.seed)
        rows = max(r.row for r in self.requests) + 2
        context = -(-max(r.seq_len for r in self.requests) // PAGE) * PAGE
        self.req_to_token = torch.zeros(rows, context, dtype=torch.int32)
        full_slots = sum(-(-r.seq_len // PAGE) * PAGE for r in self.requests) + PAGE
        self.full_to_swa = torch.zeros(full_slots + PAGE + 1, dtype=torch.int64)
        self.full_to_swa[-1] = -1
        full_next, swa_next = PAGE, PAGE  # slot 0's page is the dummy one
        for r in self.requests:  # full pages per request; SWA slots packed, in another order than the full ones
            slots = torch.arange(full_next, full_next + r.seq_len)
            full_next += -(-r.seq_len // PAGE) * PAGE
            self.req_to_token[r.row, :r.seq_len] = slots.to(torch.int32)
            self.full_to_swa[slots] = torch.arange(swa_next, swa_next + r.seq_len).flip(0)
            swa_next += r.seq_len
        self.swa_slots = swa_next
        tokens = sum(r.extend for r in self.requests)
        for layer, ratio in enumerate(self.ratios):
            for i, r in enumerate(self.requests):
                self.k[layer, i] = latent(r.seq_len, g)
                if ratio:
                    self.comp[layer, i] = latent(r.seq_len // ratio, g)
            self.q[layer] = torch.randn(tokens, self.heads, 512, generator=g).to(torch.bfloat16)
            # near the rows' log-sum-exp (~5), so the sink takes a real share of each row
            self.sink[layer] = 5 + 2 * torch.randn(self.heads, generator=g)

    def swa_loc(self, i: int, positions) -> torch.Tensor:
        r = self.requests[i]
        return self.full_to_swa[self.req_to_token[r.row, positions].long()]

    def extend_k(self, layer: int) -> torch.Tensor:
        return torch.cat([self.k[layer, i][r.prefix:] for i, r in enumerate(self.requests)])

    def token(self, row: int) -> tuple[int, int]:
        """The batch row's (request index, position)."""
        for i, r in enumerate(self.requests):
            if row < r.extend:
                return i, r.prefix + row
            row -= r.extend
        raise IndexError(row)

    def c4_scores(self, max_len: int) -> torch.Tensor:
        """The indexer's scores [tokens, max_len]: distinct, so the top-k is unique when it must choose."""
        tokens = sum(r.extend for r in self.requests)
        g = torch.Generator().manual_seed(self.seed + 1)
        return torch.randperm(tokens * max_len, generator=g).view(tokens, max_len).float()

    def reference(self, layer: int, scores=None, topk: int = 512) -> torch.Tensor:
        """float64 attention of every extend token: its SWA window (the last 128 positions, itself included)
        plus, for a compressed layer, the ratio blocks complete at its position (c4: the top-k by `scores`).
        The sink scales each output by exp(lse) / (exp(lse) + exp(sink))."""
        ratio, out, row0 = self.ratios[layer], [], 0
        q, sink = self.q[layer].double(), self.sink[layer].double()
        for i, r in enumerate(self.requests):
            pos = torch.arange(r.prefix, r.seq_len)[:, None]  # [t, 1]
            keys, allowed = self.k[layer, i].double(), (torch.arange(r.seq_len)[None] <= pos) & (
                torch.arange(r.seq_len)[None] > pos - WINDOW)
            if ratio:
                blocks = self.comp[layer, i].double()
                visible = torch.arange(blocks.shape[0])[None] < (pos + 1) // ratio
                if ratio == 4:
                    for t in range(r.extend):  # more complete blocks than top-k: the k best scores
                        n = int(visible[t].sum())
                        if n > topk:
                            visible[t] = False
                            visible[t, scores[row0 + t, :n].topk(topk).indices] = True
                keys, allowed = torch.cat([blocks, keys]), torch.cat([visible, allowed], dim=1)
            logits = torch.einsum("thd,sd->ths", q[row0:row0 + r.extend], keys) * SCALE
            logits = logits.masked_fill(~allowed[:, None, :], -math.inf)
            lse = torch.logsumexp(logits, dim=-1)
            weights = torch.softmax(logits, dim=-1) * torch.sigmoid(lse - sink)[..., None]
            out.append(torch.einsum("ths,sd->thd", weights, keys))
            row0 += r.extend
        return torch.cat(out)


def build(api, world: World) -> Driver:
    full_size = world.full_to_swa.shape[0] - PAGE - 1
    spec = api.mods["spec"].SpeculativeAlgorithm.from_string("NONE")
    return Driver(api, RealDsv4(api, req_to_token=world.req_to_token, full_to_swa=world.full_to_swa,
                                full_size=full_size, swa_size=world.swa_slots, layer_ratios=world.ratios,
                                heads=world.heads, spec_algorithm=spec))


class Driver:
    """What SGLang's eager runner and model do with the backend, for these tests: a real EXTEND ForwardBatch,
    metadata init, the resolver, one layer's forward (the session does the same on the harness's device)."""

    def __init__(self, api, real: RealDsv4):
        self.api, self.real = api, real
        self.backend, self.pool = real.backend, real.pool
        self.envs = api.mods["environ"].envs

    def forward_batch(self, requests):
        """A real EXTEND ForwardBatch whose new tokens write to the requests' slots in req_to_token."""
        mods, r2t = self.api.mods, self.real.req_to_token
        out_cache_loc = torch.cat([r2t[r.row, r.prefix:r.seq_len].long() for r in requests])
        ext, seq, prefix = [r.extend for r in requests], [r.seq_len for r in requests], [r.prefix for r in requests]
        starts = [sum(ext[:i]) for i in range(len(ext))]
        return mods["forward"].ForwardBatch(
            forward_mode=mods["forward"].ForwardMode.EXTEND, batch_size=len(requests),
            input_ids=torch.zeros(sum(ext), dtype=torch.int64),
            req_pool_indices=torch.tensor([r.row for r in requests], dtype=torch.int64),
            seq_lens=torch.tensor(seq, dtype=torch.int64), out_cache_loc=out_cache_loc,
            seq_lens_sum=sum(seq), seq_lens_cpu=torch.tensor(seq, dtype=torch.int64),
            positions=torch.cat([torch.arange(r.prefix, r.seq_len) for r in requests]),
            extend_seq_lens=torch.tensor(ext, dtype=torch.int32), extend_seq_lens_cpu=ext,
            extend_prefix_lens=torch.tensor(prefix, dtype=torch.int32), extend_prefix_lens_cpu=prefix,
            extend_num_tokens=sum(ext), extend_start_loc=torch.tensor(starts, dtype=torch.int32),
            spec_algorithm=self.backend.model_runner.spec_algorithm,
            capture_hidden_mode=mods["forward"].CaptureHiddenMode.NULL)

    def init_forward_metadata(self, fb) -> None:
        with switches(self.api):
            self.backend.init_forward_metadata(fb)

    def resolve_shared_read_ends(self, fb, *, sparse: bool):
        """The 0.5.23 resolver as the eager runner calls it after metadata init (read-done on)."""
        with switches(self.api), self.envs.SGLANG_OPT_FLASHMLA_SPARSE_PREFILL.override(sparse), \
                self.envs.SGLANG_ENABLE_PREFILL_WAR_READ_DONE.override(True):
            return self.backend.resolve_prefill_shared_read_ends(fb, num_qo_tokens=fb.extend_num_tokens)

    def forward(self, layer: int, q, k, fb, sink, *, sparse: bool) -> torch.Tensor:
        with switches(self.api), self.envs.SGLANG_OPT_FLASHMLA_SPARSE_PREFILL.override(sparse):
            return self.backend.forward(q, k, k, self.real.layers[layer], fb, compress_ratio=self.real.layer_ratios[layer],
                                        attn_sink=sink)


def write_history(driver: Driver, world: World) -> None:
    """The prefix's KV, as earlier forwards left it: SWA latents and complete compressed blocks."""
    for layer, ratio in enumerate(world.ratios):
        for i, r in enumerate(world.requests):
            if r.prefix:
                driver.real.write_swa(layer, world.swa_loc(i, slice(0, r.prefix)).to(torch.int32),
                                      world.k[layer, i][:r.prefix])
            blocks = r.prefix // ratio if ratio else 0
            if blocks:
                last = torch.arange(1, blocks + 1) * ratio - 1
                loc = world.req_to_token[r.row, last].long() // ratio
                driver.real.write_compressed(layer, loc, world.comp[layer, i][:blocks])


def write_compressor_outputs(driver: Driver, world: World, layer: int) -> torch.Tensor:
    """This batch's compressed latents, at the rows and locations SGLang's plan and metadata give."""
    ratio = world.ratios[layer]
    rows, loc = driver.real.compressor_writes(ratio)
    latents = []
    for row, at in zip(rows.tolist(), loc.tolist()):
        i, p = world.token(row)
        assert (p + 1) % ratio == 0
        assert at == int(world.req_to_token[world.requests[i].row, p]) // ratio  # the slot rule of the history
        latents.append(world.comp[layer, i][(p + 1) // ratio - 1])
    if latents:
        driver.real.write_compressed(layer, loc, torch.stack(latents))
    return rows


def run_layers(driver: Driver, world: World, *, sparse: bool, layers=None):
    """One forward: the real metadata init, then per layer the harness's compressor outputs and indexer
    scores and the real backend.forward. Returns ({layer: out}, the c4 scores, the batch)."""
    fb = driver.forward_batch(world.requests)
    driver.init_forward_metadata(fb)
    scores = None
    outs = {}
    for layer in (layers if layers is not None else range(len(world.ratios))):
        ratio = world.ratios[layer]
        if ratio:
            write_compressor_outputs(driver, world, layer)
        if ratio == 4:
            max_len = max(r.seq_len for r in world.requests) // 4 + 1
            scores = world.c4_scores(max_len)
            driver.real.c4_top_k(driver.backend.forward_metadata, scores)
        outs[layer] = driver.forward(layer, world.q[layer], world.extend_k(layer), fb,
                                      world.sink[layer].float(), sparse=sparse)
    return outs, scores, fb


def assert_close(out: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    """bf16 output (float32 softmax from bf16 inputs): within a few bf16 ulps of the float64 reference."""
    err = (out.double() - ref).abs()
    bound = 2 ** -7 * ref.abs() + 2 ** -9 * ref.abs().amax()
    bad = err > bound
    assert not bool(bad.any()), (f"{what}: {int(bad.sum())} of {bad.numel()} values off, max error "
                                 f"{float(err.max()):.3g} at {bad.nonzero()[0].tolist()}")


# -- the JIT stand-ins against their contracts -------------------------------------------------------------

def store_reference(x: torch.Tensor, page_size: int, locs, pages: int) -> torch.Tensor:
    """store.cuh's V4 write, element by element in Python floats, into a fresh page buffer."""
    page_bytes = jit_kernels.v4_page_bytes(page_size)
    cache = torch.zeros(pages * page_bytes, dtype=torch.uint8)
    for row, loc in enumerate(locs):
        page, slot = divmod(loc, page_size)
        base = page * page_bytes
        for tile in range(7):
            vals = x[row, tile * 64:(tile + 1) * 64].float()
            scale = max(1e-4, float(vals.abs().max())) / 448
            scale = float(torch.tensor(scale, dtype=torch.float32))  # the kernel divides in float32
            exp = math.ceil(math.log2(scale))  # ue8m0: rounded up to a power of two
            cast = (vals * 2.0 ** -exp).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
            cache[base + slot * 576 + tile * 64: base + slot * 576 + (tile + 1) * 64] = cast
            cache[base + page_size * 576 + slot * 8 + tile] = exp + 127
        cache[base + slot * 576 + 448: base + slot * 576 + 576] = x[row, 448:].to(torch.bfloat16).view(torch.uint8)
    return cache.view(pages, page_bytes)


def test_store_standin_matches_the_contract_and_sglangs_triton_port(api):
    from sglang.kernels.ops.kvcache.triton_store_cache import (
        triton_fused_store_flashmla,
    )

    g = torch.Generator().manual_seed(3)
    page_size, pages = 64, 3
    x = (torch.randn(6, 512, generator=g) * torch.logspace(-3, 3, 6)[:, None]).to(torch.bfloat16)
    locs = [0, 5, 63, 64, 130, 191]
    ref = store_reference(x, page_size, locs, pages)
    mine = torch.zeros_like(ref)
    jit_kernels.fused_store_flashmla_v4(x, mine, torch.tensor(locs, dtype=torch.int32), page_size)
    assert torch.equal(mine, ref)
    # SGLang's own Triton port (ROCm), interpreted: the interpreter's float -> e4m3 cast does not round to
    # nearest even (17 -> 18, and a carry into the exponent lost: 124 -> 64), so the port is compared on the
    # latents the tests store, which every cast keeps exact.
    exact = latent(6, g)
    want = store_reference(exact, page_size, locs, pages)
    port, mine = torch.zeros_like(ref), torch.zeros_like(ref)
    triton_fused_store_flashmla(exact, port, torch.tensor(locs, dtype=torch.int64), page_size)
    jit_kernels.fused_store_flashmla_v4(exact, mine, torch.tensor(locs, dtype=torch.int64), page_size)
    assert torch.equal(port, want) and torch.equal(mine, want)
    with pytest.raises(ValueError, match="out of bounds"):
        jit_kernels.fused_store_flashmla_v4(x[:1], mine, torch.tensor([pages * page_size]), page_size)


def test_compress_plan_standin_follows_c_plan(api):
    """c_plan.cuh's host path, from its loops: which positions compress and which the ring keeps."""
    r2t = torch.arange(2 * 600, dtype=torch.int32).view(2, 600) + 256
    f2s = torch.arange(2000, dtype=torch.int64) * 3 % 1999
    seq, ext = torch.tensor([300, 9]), torch.tensor([260, 9])
    pin = torch.empty(269 * 24, dtype=torch.uint8)
    c, w = jit_kernels.plan_compress_prefill(torch.tensor([1, 0]), r2t, f2s, seq, ext, pin, 269, 4, 256, 8,
                                             False, False)
    c32, w32 = c.view(torch.int32), w.view(torch.int32)
    positions = [(0, 40 + j) for j in range(260)] + [(1, j) for j in range(9)]
    want_c = [row for row, (_, p) in enumerate(positions) if (p + 1) % 4 == 0]
    assert (c32[:, 1] & 0xFFFF).tolist() == want_c
    assert c32[:, 0].tolist() == [positions[row][1] + 1 for row in want_c]

    def ring(b: int, p: int) -> int:  # the state-ring slot of request b's position p (paged ring of 8)
        swa = int(f2s[int(r2t[[1, 0][b], p])])
        return swa // 256 * 8 + swa % 8

    for plan, row in zip(c32.tolist(), want_c):
        b, p = positions[row]
        buffer_len = 8 - min(p - [40, 0][b] + 1, 8)
        assert plan[1] >> 16 == buffer_len
        if buffer_len:
            assert plan[2:] == [ring(b, max(p - 4, 0)) // 4, ring(b, p) // 4]
        else:
            assert plan[2:] == [-1, b]
    # c4 keeps the last window plus, on a paged ring, each SWA page's last 4 positions
    kept = [row for row, (b, p) in enumerate(positions)
            if p >= [296, 4][b] or p % 256 >= 252]
    assert w32[:, 0].tolist() == kept
    assert w32[:, 1].tolist() == [ring(*positions[row]) for row in kept]



def test_compress_plan_standin_pads_an_underfilled_graph_bucket(api):
    """c_plan.cuh with `use_cuda_graph`: the plans are num_q_tokens rows, the valid ones first and invalid ones
    after (kernel_1's padding; the device-input path pads a bucket the extends underfill the same way), where
    the host path without it refuses extends that do not cover num_q_tokens."""
    r2t = torch.arange(600, dtype=torch.int32).view(1, 600) + 256
    f2s = torch.arange(1000, dtype=torch.int64)
    seq, ext, pin = torch.tensor([12]), torch.tensor([9]), torch.empty(16 * 24, dtype=torch.uint8)
    exact_c, exact_w = jit_kernels.plan_compress_prefill(torch.tensor([0]), r2t, f2s, seq, ext, pin, 9, 4, 256, 8,
                                                         False, False)
    c, w = jit_kernels.plan_compress_prefill(torch.tensor([0]), r2t, f2s, seq, ext, pin, 16, 4, 256, 8, False, True)
    assert c.shape[0] == w.shape[0] == 16
    assert torch.equal(c[: exact_c.shape[0]], exact_c) and torch.equal(w[: exact_w.shape[0]], exact_w)
    invalid_c = jit_kernels._plan_c_rows([jit_kernels.INVALID_C])
    assert all(torch.equal(row, invalid_c[0]) for row in c[exact_c.shape[0]:])
    with pytest.raises(ValueError, match="cover 9 tokens, num_q_tokens is 16"):
        jit_kernels.plan_compress_prefill(torch.tensor([0]), r2t, f2s, seq, ext, pin, 16, 4, 256, 8, False, False)


def test_decode_plan_standin_follows_c_plan(api):
    """c_plan.cuh's `plan_compress_decode_kernel`, from its body: per request, the last position's ring slot, the
    ring page of the position `ratio` before it (at least 0) and of the last one; c4 through the paged ring
    (`req_to_token`, `full_to_state`), c128 and a request ring by `rid * ring + position % ring`."""
    r2t = torch.arange(2 * 600, dtype=torch.int32).view(2, 600) + 256
    f2s = torch.arange(2000, dtype=torch.int64) * 3 % 1999
    rids, seq = torch.tensor([1, 0]), torch.tensor([300, 3])

    def ring(rid: int, p: int) -> int:  # the paged ring of 8 per SWA page of 256
        swa = int(f2s[int(r2t[rid, p])])
        return swa // 256 * 8 + swa % 8

    paged = jit_kernels.plan_compress_decode(rids, r2t, f2s, seq, 4, 256, 8, False).view(torch.int32).tolist()
    assert paged == [[300, ring(1, 299), ring(1, 295) // 4, ring(1, 299) // 4],
                     [3, ring(0, 2), ring(0, 0) // 4, ring(0, 2) // 4]]
    c128 = jit_kernels.plan_compress_decode(rids, r2t, f2s, seq, 128, 256, 128, False).view(torch.int32).tolist()
    assert c128 == [[300, 128 + 299 % 128, (128 + 171 % 128) // 128, (128 + 299 % 128) // 128], [3, 2, 0, 0]]
    with pytest.raises(ValueError, match="use_req_ring"):
        jit_kernels.plan_compress_decode(rids, r2t, f2s, seq, 128, 256, 128, True)


def test_the_standins_take_each_releases_loader_arguments(api):
    """0.5.19's c_plan.cuh predates the request ring (0.5.20 added `use_req_ring`), and 0.5.19's and 0.5.20's store
    loader takes no layout (their store.cuh writes V4 only): the module for such a release plans as
    `use_req_ring=False` does, and its store is the V4 one. The installed release gets the module of its own
    wrapper's arguments."""
    r2t = torch.arange(600, dtype=torch.int32).view(1, 600) + 256
    f2s = torch.arange(1000, dtype=torch.int64) * 7 % 997
    seq, ext, pin = torch.tensor([12]), torch.tensor([9]), torch.empty(16 * 24, dtype=torch.uint8)
    args = (torch.tensor([0]), r2t, f2s, seq, ext, pin, 16, 4, 256, 8)
    old = jit_kernels._CompressPlanModuleWithoutRequestRing()
    for got, want in zip(old.plan_prefill(*args, True), jit_kernels.plan_compress_prefill(*args, False, True)):
        assert torch.equal(got, want)
    assert torch.equal(old.plan_decode(torch.tensor([0]), r2t, f2s, seq, 4, 256, 8),
                       jit_kernels.plan_compress_decode(torch.tensor([0]), r2t, f2s, seq, 4, 256, 8, False))
    assert isinstance(jit_kernels._fused_store_module("flashmla", torch.bfloat16, torch.int64, 256),
                      jit_kernels._FusedStoreModule)
    with pytest.raises(NotImplementedError, match="indexer"):
        jit_kernels._fused_store_module("indexer", torch.bfloat16, torch.int64, 256)
    generate = importlib.import_module("sglang.kernels.ops.attention.dsv4.compress").CompressorPrefillPlan.generate
    takes_ring = "use_req_ring" in inspect.signature(generate).parameters
    assert (type(jit_kernels._compress_plan_module()) is jit_kernels._CompressPlanModule) == takes_ring


# -- the real backend ----------------------------------------------------------------------------------------

# prefixes > 0; extends that straddle a 256 page and the 128 window; three requests
REQUESTS = [Request(1, 100, 170), Request(3, 40, 60), Request(0, 250, 20)]


def test_builds_by_init_and_reads_the_callers_tables(api):
    world = World(REQUESTS[:1], ratios=(0,))
    driver = build(api, world)
    assert driver.backend.req_to_token is world.req_to_token
    assert driver.backend.token_to_kv_pool is driver.pool
    assert driver.pool.full_to_swa_index_mapping is world.full_to_swa
    assert driver.real.req_to_token_pool.req_to_token is world.req_to_token
    fb = driver.forward_batch(world.requests)
    driver.init_forward_metadata(fb)
    core = driver.backend.forward_metadata.core_attn_metadata
    assert type(core).__name__ == "DSV4AttnMetadata"
    # the SWA write locations were translated through the caller's mapping at init
    want = world.full_to_swa[fb.out_cache_loc].to(torch.int32)
    assert torch.equal(core.swa_out_cache_loc, want)
    world.full_to_swa.zero_()  # a scheduler mutation after init: the snapshot is unaffected
    assert torch.equal(driver.backend.get_swa_out_cache_loc(fb), want)


@pytest.mark.parametrize("sparse", [True, False], ids=["sparse", "dense"])
def test_layers_match_float64(api, sparse):
    """Layers of ratio 0, 4 and 128 through the real forward, sparse (FlashMLA's sparse prefill over SGLang's
    chunk cache, built lazily in the first layer) or dense (flash_mla_with_kvcache over SGLang's page indices)."""
    world = World(REQUESTS, ratios=(0, 4, 128), seed=2)
    driver = build(api, world)
    write_history(driver, world)
    outs, scores, fb = run_layers(driver, world, sparse=sparse)
    cache = driver.backend.forward_metadata.sparse_prefill_cache
    assert (cache is not None) == sparse  # sparse: the lazy build ran in layer 0
    for layer, out in outs.items():
        assert out.shape == (fb.extend_num_tokens, world.heads, 512) and out.dtype == torch.bfloat16
        assert_close(out, world.reference(layer, scores),
                     f"layer {layer} ratio {world.ratios[layer]} ({'sparse' if sparse else 'dense'})")
    # the pool round trip is lossless: the history and this batch's stores, bit for bit, through SGLang's own
    # dequantizer and through the harness's reader of the same layout (what the kv oracle reads)
    real, full_size = driver.real, world.full_to_swa.shape[0] - PAGE - 1
    swa, extra = real.read_swa(), real.read_compressed(full_size)
    for layer, ratio in enumerate(world.ratios):
        for i, r in enumerate(world.requests):
            loc = world.swa_loc(i, slice(0, r.seq_len))
            assert torch.equal(sglang_read(real.swa_buffer(layer), loc, PAGE), world.k[layer, i])
            assert torch.equal(swa[layer, loc], world.k[layer, i].float())
            blocks = r.seq_len // ratio if ratio else 0
            if blocks:
                loc = world.req_to_token[r.row, torch.arange(1, blocks + 1) * ratio - 1].long() // ratio
                page = real.pool.get_extra_key_page_size(layer)
                assert torch.equal(sglang_read(real.extra_buffer(layer), loc, page), world.comp[layer, i][:blocks])
                assert torch.equal(extra[layer, loc * ratio], world.comp[layer, i][:blocks].float())


def sglang_read(buffer: torch.Tensor, loc: torch.Tensor, page_size: int) -> torch.Tensor:
    """The cache at `loc`, dequantized by SGLang's own reader (`dequantize_k_cache_paged_dsv4`): [n, 512] bf16."""
    from sglang.kernels.ops.attention.dsv4.dequant_k_cache import (
        dequantize_k_cache_paged_dsv4,
    )

    return dequantize_k_cache_paged_dsv4(buffer, loc, page_size=page_size)[:, 0]


def test_read_v4_decodes_as_sglangs_dequantizer_and_places_every_slot(api):
    """`read_v4` over a whole page buffer equals SGLang's dequantizer slot by slot (any bf16 values, scales over
    the whole range, unwritten slots zero); `read_compressed` puts a slot at ratio x slot, the reserved page's
    slots after the full slots."""
    world = World([Request(1, 0, 20)], ratios=(0, 4, 128))
    driver = build(api, world)
    real, full_size = driver.real, world.full_to_swa.shape[0] - PAGE - 1
    g = torch.Generator().manual_seed(9)
    x = (torch.randn(7, 512, generator=g) * torch.logspace(-3, 3, 7)[:, None]).to(torch.bfloat16)
    loc = torch.tensor([0, 3, 255, 256, 300, 400, 511])
    real.write_swa(0, loc, x)
    decoded = read_v4(real.swa_buffer(0), PAGE)
    assert decoded.shape == (real.swa_buffer(0).shape[0] * PAGE, 512)
    assert torch.equal(decoded[loc], sglang_read(real.swa_buffer(0), loc, PAGE).float())
    assert not decoded[torch.tensor([1, 2, 257])].any()
    c4, c128 = full_size // 4, full_size // 128
    real.write_compressed(1, torch.tensor([5, c4]), x[:2])  # c4: a slot the tables address, one past them
    real.write_compressed(2, torch.tensor([1, c128 + 2]), x[2:4])
    extra = real.read_compressed(full_size)
    held = read_v4(real.extra_buffer(1), real.pool.get_extra_key_page_size(1))[5]
    assert torch.equal(extra[1, 20], held) and torch.equal(extra[1, full_size], read_v4(
        real.extra_buffer(1), real.pool.get_extra_key_page_size(1))[c4])
    assert torch.equal(extra[2, 128], read_v4(real.extra_buffer(2), 2)[1]) and extra[2, full_size + 2].any()
    assert int((extra.abs().sum(-1) > 0).sum()) == 4 and not extra[0].any()


def test_the_reference_is_sharp(api):
    """The float64 reference tells a window off by one and a missing sink from the real output."""
    world = World(REQUESTS[:1], ratios=(0,), seed=5)
    driver = build(api, world)
    write_history(driver, world)
    outs, _, _ = run_layers(driver, world, sparse=False)
    assert_close(outs[0], world.reference(0), "ratio 0")
    wrong = World(REQUESTS[:1], ratios=(0,), seed=5)
    wrong.sink[0] = torch.full_like(wrong.sink[0], -math.inf)
    with pytest.raises(AssertionError):
        assert_close(outs[0], wrong.reference(0), "no sink")
    global WINDOW
    saved, WINDOW = WINDOW, WINDOW + 1
    try:
        with pytest.raises(AssertionError):
            assert_close(outs[0], world.reference(0), "window 129")
    finally:
        WINDOW = saved


def test_c4_topk_chooses_by_the_scores(api):
    """More c4 blocks than index_topk (512): SGLang's top-k transform picks by the harness's scores."""
    world = World([Request(1, 2060, 40)], ratios=(4,), seed=4)
    driver = build(api, world)
    write_history(driver, world)
    outs, scores, _ = run_layers(driver, world, sparse=True)
    raw = driver.backend.forward_metadata.core_metadata.c4_sparse_raw_indices
    assert int((raw[-1] >= 0).sum()) == 512
    assert_close(outs[0], world.reference(0, scores), "c4 layer beyond top-k")


@pytest.mark.parametrize("snapshot", [True, False], ids=["snapshot", "lazy"])
def test_a_mutation_after_init_reaches_only_the_lazy_build(api, snapshot):
    """The scheduler clears the mapping of the batch's window slots and rewrites its req_to_token row after
    metadata init. With the resolver's snapshot (the chunk cache built at init) the real forward is
    untouched; without it, the first layer's lazy build reads the mutated tables and the output is wrong."""
    world = World(REQUESTS[:1], ratios=(0,), seed=6)
    driver = build(api, world)
    write_history(driver, world)
    fb = driver.forward_batch(world.requests)
    driver.init_forward_metadata(fb)
    if snapshot:
        ends = driver.resolve_shared_read_ends(fb, sparse=True)
        assert ends.name == "PRE_REPLAY"
        assert driver.backend.forward_metadata.sparse_prefill_cache is not None
    r = world.requests[0]
    world.full_to_swa[world.req_to_token[r.row, :r.seq_len].long()] = 0  # index_fill_(0, slots, 0)
    world.req_to_token[r.row].zero_()
    out = driver.forward(0, world.q[0], world.extend_k(0), fb, world.sink[0], sparse=True)
    clean = World(REQUESTS[:1], ratios=(0,), seed=6)
    if snapshot:
        assert_close(out, clean.reference(0), "after the snapshot")
    else:
        with pytest.raises(AssertionError):
            assert_close(out, clean.reference(0), "lazy build after the mutation")


@pytest.mark.parametrize("snapshot", [True, False], ids=["snapshot", "lazy"])
def test_the_observer_sees_the_real_forwards_reads(api, snapshot):
    """The integration the session uses on the simulator (`eager.EagerPath`), reduced to one layer: metadata
    init (and the resolver) as host work on the forward stream, the layer's real `backend.forward` as one launch
    declaring only the SWA cache. The observer reports what SGLang's code really read, with SGLang's line: the
    lazy chunk-cache build's reads of req_to_token and the mapping in layer 0, and none once the resolver
    snapshotted them."""
    from harness.device.sim import SimDevice

    world = World([Request(1, 100, 60)], ratios=(0,), seed=7)
    driver = build(api, world)
    write_history(driver, world)
    dev = SimDevice(observe=True)
    observer = dev.observer
    observer.register("req_to_token", world.req_to_token)
    observer.register("full_to_swa", world.full_to_swa)
    observer.register("swa_kv[0]", driver.pool.get_swa_key_buffer_radix(0))
    fb = driver.forward_batch(world.requests)
    observer.register_batch(fb)
    out = torch.zeros(fb.extend_num_tokens, world.heads, 512, dtype=torch.bfloat16)
    tables = {name: None for name in ("req_to_token", "full_to_swa", "fb.req_pool_indices", "fb.seq_lens",
                                      "fb.extend_seq_lens", "fb.positions", "fb.out_cache_loc")}
    with dev.observing(), dev.stream(dev.forward_stream):
        with dev.host_work("DeepseekV4AttnBackend.init_forward_metadata", reads=tables):
            driver.init_forward_metadata(fb)
            if snapshot:
                driver.resolve_shared_read_ends(fb, sparse=True)
        metadata = driver.backend.forward_metadata  # bound at issue, as a launch binds its pointers

        def layer0():
            saved, driver.backend.forward_metadata = driver.backend.forward_metadata, metadata
            try:
                out.copy_(driver.forward(0, world.q[0], world.extend_k(0), fb, world.sink[0], sparse=True))
            finally:
                driver.backend.forward_metadata = saved

        dev.launch("layer0.DeepseekV4AttnBackend.forward", layer0, reads={"swa_kv[0]": None},
                   writes={"swa_kv[0]": None})
        dev.synchronize()
    assert_close(out, world.reference(0), "layer 0 in a simulator launch")
    seen = {(u.buffer, u.frame.split(" in ")[0].split(":")[0]) for u in observer.undeclared
            if u.op.startswith("layer0")}
    if snapshot:
        assert not {buffer for buffer, _ in seen} & {"req_to_token", "full_to_swa"}, seen
    else:
        assert ("req_to_token", "sglang/kernels/ops/attention/dsv4/sparse_prefill_kernels.py") in seen, seen
        assert ("full_to_swa", "sglang/kernels/ops/attention/dsv4/sparse_prefill_kernels.py") in seen, seen


# -- timing (not a test) ---------------------------------------------------------------------------------------

def timing() -> None:
    from harness.sglang_target.api import load_api

    api = load_api()
    for label, requests in (("~300 tokens", [Request(1, 100, 200), Request(3, 40, 90)]),
                            ("~2000 tokens", [Request(1, 300, 1200), Request(3, 200, 800)])):
        for ratios in ((0,), (0, 4, 128)):
            world = World(requests, ratios=ratios)
            driver = build(api, world)
            write_history(driver, world)
            for sparse in (True, False):
                fb = driver.forward_batch(world.requests)
                t0 = time.perf_counter()
                driver.init_forward_metadata(fb)
                t_init = time.perf_counter() - t0
                per_layer = []
                for layer, ratio in enumerate(ratios):
                    if ratio:
                        write_compressor_outputs(driver, world, layer)
                    if ratio == 4:
                        scores = world.c4_scores(max(r.seq_len for r in requests) // 4 + 1)
                        driver.real.c4_top_k(driver.backend.forward_metadata, scores)
                    t0 = time.perf_counter()
                    driver.forward(layer, world.q[layer], world.extend_k(layer), fb, world.sink[layer], sparse=sparse)
                    per_layer.append(f"r{ratio}={time.perf_counter() - t0:.2f}s")
                print(f"{label} ({fb.extend_num_tokens} rows) ratios {ratios} {'sparse' if sparse else 'dense'}: "
                      f"init_forward_metadata {t_init:.2f}s; forward {', '.join(per_layer)}", flush=True)


if __name__ == "__main__" and "--timing" in sys.argv:
    timing()
