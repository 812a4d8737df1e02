"""The torch stand-in for `flash_mla` (`harness/sglang_target/flash_mla.py`) against float64 references
written from FlashMLA's contract (its docstrings and tests/ref.py), not from the stand-in's code: per
query and head, the valid keys listed, the softmax written out, the sink as the documented factor
exp(lse) / (exp(lse) + exp(sink)). The V4 FP8 cache is written by a helper from the layout spec and
read back bit for bit. Also: bit-determinism, the scheduling record, install(), the forms not stood in,
and SGLang's own wrapper driven through the stand-in where sglang is installed."""

from __future__ import annotations

import importlib
import math
import sys

import pytest
import torch

from harness.sglang_target import flash_mla as fm
from harness.sglang_target.api import StandIns

LOG2E = 1.0 / math.log(2.0)
INF = math.inf


# ---- float64 references, from the contract ----

def ref_attend(q_row: torch.Tensor, keys: torch.Tensor, scale: float, d_v: int, sink: torch.Tensor | None):
    """One query row [h, d] over its valid keys [t, d] (float64): out [h, d_v], max_logits [h], lse [h];
    no key: out 0, max_logits -inf, lse +inf. The sink multiplies out by exp(lse)/(exp(lse)+exp(sink))."""
    h = q_row.shape[0]
    out = torch.zeros(h, d_v, dtype=torch.float64)
    max_logits = torch.full((h,), -INF, dtype=torch.float64)
    lse = torch.full((h,), INF, dtype=torch.float64)
    if keys.shape[0] == 0:
        return out, max_logits, lse
    for head in range(h):
        logits = [float(keys[t] @ q_row[head]) * scale for t in range(keys.shape[0])]
        m = max(logits)
        total = math.log(sum(math.exp(x - m) for x in logits)) + m
        weights = torch.tensor([math.exp(x - total) for x in logits], dtype=torch.float64)
        factor = 1.0  # exp(lse) / (exp(lse) + exp(sink)), with the infinities written out
        if sink is not None and float(sink[head]) == INF:
            factor = 0.0
        elif sink is not None and float(sink[head]) != -INF:
            top = max(total, float(sink[head]))  # shifted by the larger, so neither exp overflows
            factor = math.exp(total - top) / (math.exp(total - top) + math.exp(float(sink[head]) - top))
        out[head] = factor * (weights @ keys[:, :d_v])
        max_logits[head], lse[head] = m, total
    return out, max_logits, lse


def ref_sparse_prefill(q, kv, indices, sm_scale, d_v, sink, topk_length):
    """Query i attends to kv[j] for j in indices[i, 0, :topk_length[i]] with 0 <= j < s_kv."""
    s_q, s_kv, topk = q.shape[0], kv.shape[0], indices.shape[-1]
    outs, maxes, lses = [], [], []
    for i in range(s_q):
        n = topk if topk_length is None else int(topk_length[i])
        chosen = [j for j in indices[i, 0, :n].tolist() if 0 <= j < s_kv]
        o, m, s = ref_attend(q[i].double(), kv[chosen, 0].double(), sm_scale, d_v, sink)
        outs.append(o), maxes.append(m), lses.append(s)
    return torch.stack(outs), torch.stack(maxes), torch.stack(lses)


def ref_sparse_decode(q, scopes, scale, sink):
    """scopes: (token -> key [float64 table], indices [b, s_q, topk], topk_length [b] or None); a query's
    keys are the main scope's then the extra's, -1 and positions past topk_length skipped.
    Returns out [b, s_q, h_q, 512] and lse [b, h_q, s_q] (natural, without the sink)."""
    b, s_q, h_q, _ = q.shape
    out = torch.zeros(b, s_q, h_q, 512, dtype=torch.float64)
    lse = torch.zeros(b, h_q, s_q, dtype=torch.float64)
    for i in range(b):
        for j in range(s_q):
            rows = []
            for table, idx, length in scopes:
                n = idx.shape[-1] if length is None else int(length[i])
                rows += [table[t] for t in idx[i, j, :n].tolist() if t != -1]
            keys = torch.stack(rows) if rows else torch.zeros(0, 512, dtype=torch.float64)
            o, _, s = ref_attend(q[i, j].double(), keys, scale, 512, sink)
            out[i, j], lse[i, :, j] = o, s
    return out, lse


# ---- the V4 FP8 cache, written from the layout spec ----
# Per page: token t's 448 e4m3 NoPE bytes and 64 little-endian bf16 RoPE values at t*576; after all
# page_size tokens, token t's 7 ue8m0 scale bytes (2 ** (byte - 127), one per 64 NoPE values) and a pad
# byte at page_size*576 + t*8. Pages padded to a multiple of 576 bytes, as SGLang's pool allocates them.

def write_v4_cache(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k [num_pages, page_size, 512] bf16 -> (buffer [num_pages, padded] uint8, the kernel's view
    [num_pages, page_size, 1, 584]). Scale per tile: the power of two 2**ceil(log2(amax/448))."""
    pages, page_size, _ = k.shape
    padded = -(-page_size * 584 // 576) * 576
    buf = torch.zeros(pages, padded, dtype=torch.uint8)
    for p in range(pages):
        for t in range(page_size):
            base, scale_base = t * 576, page_size * 576 + t * 8
            for tile in range(7):
                vals = k[p, t, tile * 64:(tile + 1) * 64].double()
                exponent = math.ceil(math.log2(max(vals.abs().max().item(), 1e-30) / 448.0))
                buf[p, scale_base + tile] = exponent + 127
                q8 = (vals / 2.0 ** exponent).to(torch.float8_e4m3fn)
                buf[p, base + tile * 64: base + (tile + 1) * 64] = q8.view(torch.uint8)
            buf[p, base + 448: base + 576] = k[p, t, 448:].contiguous().view(torch.uint8)
    view = buf[:, :page_size * 584].view(pages, page_size, 1, 584)
    return buf, view


def exact_v4_keys(gen: torch.Generator, pages: int, page_size: int) -> torch.Tensor:
    """Keys the layout holds exactly: each NoPE tile is e4m3 values times a power of two, RoPE any bf16."""
    codes = torch.randint(0, 256, (pages, page_size, 7, 64), generator=gen).to(torch.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x38  # no NaN codes
    exponents = torch.randint(-9, -2, (pages, page_size, 7, 1), generator=gen).double()
    nope = codes.view(torch.float8_e4m3fn).double() * 2.0 ** exponents
    rope = torch.randn(pages, page_size, 64, generator=gen, dtype=torch.float64)
    return torch.cat([nope.reshape(pages, page_size, 448), rope], dim=-1).to(torch.bfloat16)


def test_the_v4_layout_is_read_as_the_spec_writes_it():
    # One hand-placed token: page 1, slot 2 of 4. e4m3 0x38 is 1.0; its tile (2) has scale byte 130, 2**3.
    # RoPE value 5 is bf16 0x3FC0 (1.5), little-endian. Every other byte 0, so every other value 0.
    page_size = 4
    buf = torch.zeros(3, -(-page_size * 584 // 576) * 576, dtype=torch.uint8)
    buf[1, 2 * 576 + 130] = 0x38
    buf[1, page_size * 576 + 2 * 8 + 2] = 130
    buf[1, 2 * 576 + 448 + 10], buf[1, 2 * 576 + 448 + 11] = 0xC0, 0x3F
    view = buf[:, :page_size * 584].view(3, page_size, 1, 584)
    key = fm._gather_v4(fm._v4_pages(view, "k_cache"), page_size, torch.tensor([1 * page_size + 2])).double()[0]
    expected = torch.zeros(512, dtype=torch.float64)
    expected[130], expected[448 + 5] = 8.0, 1.5
    assert torch.equal(key, expected)

    # A whole cache from the writer, on padded pages, read back bit for bit, in any order.
    gen = torch.Generator().manual_seed(1)
    k = exact_v4_keys(gen, 5, 4)
    _, view = write_v4_cache(k)
    tokens = torch.randperm(20, generator=gen).view(4, 5)
    got = fm._gather_v4(fm._v4_pages(view, "k_cache"), 4, tokens)
    assert got.dtype == torch.bfloat16 and torch.equal(got.view(torch.int16), k.view(20, 512)[tokens].view(torch.int16))


# ---- sparse prefill ----

def prefill_inputs(seed: int, d_qk: int, h_q: int, sink: str | None, lengths: bool):
    gen = torch.Generator().manual_seed(seed)
    s_q, s_kv, topk = 6, 40, 16
    q = torch.randn(s_q, h_q, d_qk, generator=gen).to(torch.bfloat16)
    kv = torch.randn(s_kv, 1, d_qk, generator=gen).to(torch.bfloat16)
    indices = torch.randint(0, s_kv, (s_q, 1, topk), generator=gen, dtype=torch.int32)
    for pos, bad in zip(range(0, topk, 3), (-1, s_kv, -7, 2**31 - 1, -2**31, s_kv + 3)):
        indices[1:, 0, pos] = bad  # every kind of invalid index, skipped
    indices[0] = -1  # a query with no valid index
    indices[2, 0, :] = torch.where(torch.arange(topk) % 2 == 0, -1, 5)  # a repeated key counts each time
    topk_length = None
    if lengths:
        topk_length = torch.tensor([topk, 0, 3, topk, 9, 1], dtype=torch.int32)
    attn_sink = None
    if sink is not None:
        attn_sink = torch.randn(h_q, generator=gen)
        if sink == "inf":
            attn_sink[0], attn_sink[-1] = INF, -INF
    return q, kv, indices, attn_sink, topk_length


@pytest.mark.parametrize("d_qk,d_v", [(512, 512), (80, 64)])
@pytest.mark.parametrize("sink", [None, "finite", "inf"])
@pytest.mark.parametrize("lengths", [False, True])
def test_sparse_prefill_matches_the_contract(d_qk, d_v, sink, lengths):
    h_q = 2 + (d_qk + len(sink or "")) % 3  # 2 to 4 heads across the cases
    q, kv, indices, attn_sink, topk_length = prefill_inputs(d_qk, d_qk, h_q, sink, lengths)
    scale = d_qk ** -0.5
    out, max_logits, lse = fm.flash_mla_sparse_fwd(q, kv, indices, scale, d_v, attn_sink, topk_length,
                                                   use_legacy=False, return_log2_lse=None)
    ref_out, ref_max, ref_lse = ref_sparse_prefill(q, kv, indices, scale, d_v, attn_sink, topk_length)
    assert out.dtype == torch.bfloat16 and out.shape == (6, h_q, d_v)
    assert max_logits.dtype == lse.dtype == torch.float32 and lse.shape == (6, h_q)
    torch.testing.assert_close(out.double(), ref_out, rtol=2**-7, atol=1e-4)
    torch.testing.assert_close(max_logits.double(), ref_max, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-5, atol=1e-5)
    assert torch.equal(out[0], torch.zeros_like(out[0])) and (max_logits[0] == -INF).all() and (lse[0] == INF).all()
    if lengths:
        assert (lse[1] == INF).all()  # topk_length 0: nothing attended
    if sink == "inf":
        assert (out[:, 0] == 0).all()  # a +inf sink takes all the weight

    # The legacy kernel's statistics (and SGLang's wrapper asks for them): base 2, the same +-inf.
    out2, max2, lse2 = fm.flash_mla_sparse_fwd(q, kv, indices, scale, d_v, attn_sink, topk_length,
                                               use_legacy=True, return_log2_lse=True)
    assert torch.equal(out2, out)
    torch.testing.assert_close(max2.double(), ref_max * LOG2E, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse2.double(), ref_lse * LOG2E, rtol=1e-5, atol=1e-5)


def test_sparse_prefill_never_reads_a_skipped_key():
    q, kv, indices, attn_sink, topk_length = prefill_inputs(3, 64, 3, "finite", True)
    indices[indices == 0] = 1  # key 0 is never attended, so it is NaN below: where a skipped index might land
    used = torch.zeros(kv.shape[0], dtype=torch.bool)
    for i in range(indices.shape[0]):
        row = indices[i, 0, :int(topk_length[i])]
        used[row[(row >= 0) & (row < kv.shape[0])].long()] = True
    kv[~used] = float("nan")
    out, max_logits, lse = fm.flash_mla_sparse_fwd(q, kv, indices, 0.125, 64, attn_sink, topk_length)
    assert not out.isnan().any() and not lse.isnan().any() and not max_logits.isnan().any()


@pytest.mark.gpu
def test_sparse_prefill_on_cuda_matches_the_contract_without_a_host_sync():
    """The kernel runs ahead of the host: a stand-in that read its inputs on the host in every layer held the host
    to the GPU, so the scheduler's work could never overlap the forward's tail (issue 30's figure). torch's sync
    debug mode raises on any synchronizing call."""
    q, kv, indices, attn_sink, topk_length = prefill_inputs(5, 80, 3, "finite", True)
    on_gpu = [t.cuda() for t in (q, kv, indices, attn_sink, topk_length)]
    torch.cuda.set_sync_debug_mode("error")
    try:
        out, _, lse = fm.flash_mla_sparse_fwd(*on_gpu[:3], 80 ** -0.5, 64, *on_gpu[3:], use_legacy=False)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    ref_out, _, ref_lse = ref_sparse_prefill(q, kv, indices, 80 ** -0.5, 64, attn_sink, topk_length)
    torch.testing.assert_close(out.cpu().double(), ref_out, rtol=2**-7, atol=1e-4)
    torch.testing.assert_close(lse.cpu().double(), ref_lse, rtol=1e-5, atol=1e-5)


def test_sparse_prefill_checks_the_kernels_inputs():
    q, kv, indices, attn_sink, _ = prefill_inputs(4, 64, 2, "finite", True)
    with pytest.raises(ValueError, match="indices must be torch.int32"):
        fm.flash_mla_sparse_fwd(q, kv, indices.long(), 0.1, 64)
    with pytest.raises(ValueError, match="attn_sink must have shape"):
        fm.flash_mla_sparse_fwd(q, kv, indices, 0.1, 64, attn_sink[:1])
    with pytest.raises(ValueError, match="q must be torch.bfloat16"):
        fm.flash_mla_sparse_fwd(q.float(), kv, indices, 0.1, 64)


# ---- sparse FP8 decode over the V4 cache ----

def decode_inputs(seed: int, h_q: int, sink: str | None, extra: bool, lengths: bool):
    gen = torch.Generator().manual_seed(seed)
    b, s_q = 3, 2
    main_k = exact_v4_keys(gen, 5, 4)  # 20 tokens, pages of 4
    extra_k = exact_v4_keys(gen, 6, 2)  # 12 tokens, pages of 2
    _, main_view = write_v4_cache(main_k)
    _, extra_view = write_v4_cache(extra_k)
    q = torch.randn(b, s_q, h_q, 512, generator=gen).to(torch.bfloat16)
    indices = torch.randint(0, 20, (b, s_q, 8), generator=gen, dtype=torch.int32)
    indices[:, :, 1::3] = -1
    indices[2] = -1  # batch 2: no main key ...
    extra_indices = torch.randint(0, 12, (b, s_q, 4), generator=gen, dtype=torch.int32)
    extra_indices[:, 0, 2] = -1
    extra_indices[2, 1] = -1  # ... and query (2, 1) no extra key either
    topk_length = torch.tensor([8, 3, 5], dtype=torch.int32) if lengths else None
    extra_topk_length = torch.tensor([2, 4, 4], dtype=torch.int32) if lengths else None
    attn_sink = None
    if sink is not None:
        attn_sink = torch.randn(h_q, generator=gen)
        if sink == "inf":
            attn_sink[0], attn_sink[-1] = INF, -INF
    tables = (main_k.view(-1, 512).double(), extra_k.view(-1, 512).double())
    call = {"q": q, "k_cache": main_view, "block_table": None, "cache_seqlens": None, "head_dim_v": 512,
            "softmax_scale": 512 ** -0.5, "is_fp8_kvcache": True, "indices": indices, "attn_sink": attn_sink,
            "topk_length": topk_length}
    scopes = [(tables[0], indices, topk_length)]
    if extra:
        call.update(extra_k_cache=extra_view, extra_indices_in_kvcache=extra_indices,
                    extra_topk_length=extra_topk_length)
        scopes.append((tables[1], extra_indices, extra_topk_length))
    return call, scopes


@pytest.mark.parametrize("h_q", [2, 4])
@pytest.mark.parametrize("sink", [None, "finite", "inf"])
@pytest.mark.parametrize("extra,lengths", [(False, False), (True, False), (True, True)])
def test_sparse_fp8_decode_matches_the_contract(h_q, sink, extra, lengths):
    call, scopes = decode_inputs(h_q, h_q, sink, extra, lengths)
    meta, none = fm.get_mla_metadata()
    assert none is None
    out, lse = fm.flash_mla_with_kvcache(tile_scheduler_metadata=meta, **call)
    ref_out, ref_lse = ref_sparse_decode(call["q"], scopes, call["softmax_scale"], call["attn_sink"])
    assert out.dtype == torch.bfloat16 and out.shape == (3, 2, h_q, 512)
    assert lse.dtype == torch.float32 and lse.shape == (3, h_q, 2)  # [b, h_q, s_q], as the kernel returns it
    torch.testing.assert_close(out.double(), ref_out, rtol=2**-7, atol=1e-4)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-5, atol=1e-5)
    lonely = (2, slice(None), 1) if extra else (2, slice(None), slice(None))
    assert (lse[lonely] == INF).all()
    assert (out[2, 1] == 0).all()


def test_sparse_fp8_decode_never_reads_a_skipped_token_and_checks_the_rest():
    call, scopes = decode_inputs(7, 2, "finite", True, True)
    expected, _ = fm.flash_mla_with_kvcache(tile_scheduler_metadata=fm.get_mla_metadata()[0], **call)
    # Poison every token no query attends to (NaN NoPE codes), and put garbage past topk_length.
    for view, (_, idx, length) in zip((call["k_cache"], call["extra_k_cache"]), scopes):
        used = set()
        for i in range(idx.shape[0]):
            used |= {t for t in idx[i, :, :int(length[i])].flatten().tolist() if t != -1}
        page_size = view.shape[1]
        for t in set(range(view.shape[0] * page_size)) - used:
            view[t // page_size, t % page_size, 0, :448] = 0x7F
        for i in range(idx.shape[0]):
            idx[i, :, int(length[i]):] = 10**6
    out, lse = fm.flash_mla_with_kvcache(tile_scheduler_metadata=fm.get_mla_metadata()[0], **call)
    assert torch.equal(out.view(torch.int16), expected.view(torch.int16)) and not lse.isnan().any()

    call["indices"][0, 0, 0] = -2  # only -1 is skipped; anything else must address a token
    with pytest.raises(ValueError, match=r"indices of k_cache outside \[-1, 20\)"):
        fm.flash_mla_with_kvcache(tile_scheduler_metadata=fm.get_mla_metadata()[0], **call)


def test_the_scheduling_record_is_written_and_checked_as_upstream_does():
    call, _ = decode_inputs(5, 2, None, True, True)
    meta = fm.get_mla_metadata()[0]
    assert (meta.have_initialized, meta.config, meta.tile_scheduler_metadata, meta.num_splits) == (False, None,
                                                                                                   None, None)
    schedule = torch.zeros(4, 8, dtype=torch.int32)
    meta.tile_scheduler_metadata = schedule  # SGLang may precompute one; it is kept
    fm.flash_mla_with_kvcache(tile_scheduler_metadata=meta, **call)
    assert meta.have_initialized and meta.tile_scheduler_metadata is schedule
    assert (meta.config.b, meta.config.s_q, meta.config.h_q, meta.config.page_block_size, meta.config.topk,
            meta.config.extra_page_block_size, meta.config.extra_topk) == (3, 2, 2, 4, 8, 2, 4)
    fm.flash_mla_with_kvcache(tile_scheduler_metadata=meta, **call)  # the same shapes: fine
    call["indices"] = call["indices"][:, :, :4].contiguous()
    with pytest.raises(AssertionError, match="sched_meta.config.topk"):
        fm.flash_mla_with_kvcache(tile_scheduler_metadata=meta, **call)


def test_the_forms_not_stood_in_say_so():
    call, _ = decode_inputs(6, 2, None, False, False)
    meta = fm.get_mla_metadata()[0]
    with pytest.raises(NotImplementedError, match="indices=None"):
        fm.flash_mla_with_kvcache(tile_scheduler_metadata=meta, **{**call, "indices": None})
    with pytest.raises(NotImplementedError, match="tile_scheduler_metadata"):
        fm.flash_mla_with_kvcache(tile_scheduler_metadata=torch.zeros(1, 8, dtype=torch.int32),
                                  num_splits=torch.zeros(4, dtype=torch.int32), **call)
    with pytest.raises(NotImplementedError, match="kv_format='V32_NO_ROPE'"):
        fm.flash_mla_with_kvcache(tile_scheduler_metadata=meta, kv_format="V32_NO_ROPE", **call)
    with pytest.raises(NotImplementedError, match="use_legacy=False"):
        fm.flash_mla_with_kvcache(tile_scheduler_metadata=meta, use_legacy=False, **call)
    v41 = torch.zeros(2, 4 * 528, dtype=torch.uint8).view(2, 4, 1, 528)
    with pytest.raises(NotImplementedError, match="528 bytes per token"):
        fm.flash_mla_with_kvcache(tile_scheduler_metadata=meta, **{**call, "k_cache": v41})
    with pytest.raises(NotImplementedError, match="get_mla_decoding_metadata"):
        fm.get_mla_decoding_metadata(torch.ones(2, dtype=torch.int32), 1, 1, 2, True, 64, use_legacy=True)
    for fused in (fm.fused_norm_rope_attn_rope_cast.prefill, fm.fused_norm_rope_attn_rope_cast.decode):
        with pytest.raises(NotImplementedError, match="fused_norm_rope_attn_rope_cast"):
            fused(q=None)


def test_every_op_is_bit_deterministic():
    q, kv, indices, attn_sink, topk_length = prefill_inputs(9, 512, 4, "finite", True)
    first = fm.flash_mla_sparse_fwd(q, kv, indices, 0.04, 512, attn_sink, topk_length)
    second = fm.flash_mla_sparse_fwd(q, kv, indices, 0.04, 512, attn_sink, topk_length)
    call, _ = decode_inputs(9, 4, "finite", True, True)
    first += fm.flash_mla_with_kvcache(tile_scheduler_metadata=fm.get_mla_metadata()[0], **call)
    second += fm.flash_mla_with_kvcache(tile_scheduler_metadata=fm.get_mla_metadata()[0], **call)
    for a, b in zip(first, second):
        bits = torch.int16 if a.dtype == torch.bfloat16 else torch.int32
        assert torch.equal(a.contiguous().view(bits), b.contiguous().view(bits))


def test_row_chunks_change_no_result(monkeypatch):
    q, kv, indices, attn_sink, topk_length = prefill_inputs(11, 64, 3, "finite", True)
    whole = fm.flash_mla_sparse_fwd(q, kv, indices, 0.1, 64, attn_sink, topk_length)
    monkeypatch.setattr(fm, "KEYS_PER_STEP", 1)  # one row at a time
    chunked = fm.flash_mla_sparse_fwd(q, kv, indices, 0.1, 64, attn_sink, topk_length)
    for a, b in zip(whole, chunked):
        torch.testing.assert_close(a, b)  # the same up to float32 rounding: chunks only bound memory


# ---- install() and the op list ----

@pytest.fixture
def installed():
    names = ("flash_mla", "flash_mla.flash_mla_interface", "flash_mla.fused_norm_rope_attn_rope_cast")
    saved = {name: sys.modules.get(name) for name in names}
    yield fm.install()
    for name, module in saved.items():
        if module is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = module


def test_install_makes_it_importable_under_the_packages_names(installed):
    assert set(installed) >= {"flash_mla", "flash_mla.flash_mla_interface"}
    flash_mla = importlib.import_module("flash_mla")
    from flash_mla import fused_norm_rope_attn_rope_cast  # noqa: F401 - SGLang's import, checked to work
    from flash_mla.flash_mla_interface import FlashMLASchedMeta

    assert flash_mla is fm and FlashMLASchedMeta is fm.FlashMLASchedMeta
    assert isinstance(flash_mla.get_mla_metadata()[0], FlashMLASchedMeta)
    assert flash_mla.flash_mla_interface.flash_mla_sparse_fwd is fm.flash_mla_sparse_fwd
    for name, source in fm.OPS:  # every op listed resolves, with its source of truth
        obj = flash_mla
        for part in name.split(".")[1:]:
            obj = getattr(obj, part)
        assert source
    listed = {name.split(".")[-1] for name, _ in fm.OPS}
    assert listed >= {"get_mla_metadata", "get_mla_decoding_metadata", "flash_mla_with_kvcache",
                      "flash_mla_sparse_fwd", "fused_norm_rope_attn_rope_cast", "FlashMLASchedMeta"}


def test_install_refuses_to_shadow_a_flash_mla_that_loads(installed):
    sys.modules["flash_mla"] = importlib.import_module("json")  # any module with a file
    with pytest.raises(RuntimeError, match="not stood in"):
        fm.install()


@pytest.fixture
def sgl_kernel_names():
    names = ("sgl_kernel", "sgl_kernel.flash_mla")
    saved = {name: sys.modules.pop(name, None) for name in names}
    yield
    for name, module in saved.items():
        sys.modules.pop(name, None)
        if module is not None:
            sys.modules[name] = module


def _sgl_kernel_imports_resolve_to_the_stand_in() -> None:
    """The PR-era backend's three forms: `from ... import`, `import ... as` and the attribute of the parent."""
    import sgl_kernel.flash_mla as bound  # `_create_flashmla_metadata`'s form
    from sgl_kernel.flash_mla import (
        FlashMLASchedMeta,
        flash_mla_sparse_fwd,
        flash_mla_with_kvcache,
    )

    assert bound is fm.sgl_kernel_flash_mla and sys.modules["sgl_kernel"].flash_mla is bound
    assert (flash_mla_sparse_fwd, flash_mla_with_kvcache, FlashMLASchedMeta) == (
        fm.flash_mla_sparse_fwd, fm.flash_mla_with_kvcache, fm.FlashMLASchedMeta)
    assert isinstance(bound.get_mla_metadata()[0], fm.FlashMLASchedMeta)


def test_install_for_sgl_kernel_on_a_host_without_it_makes_a_package_holding_only_flash_mla(sgl_kernel_names):
    assert set(fm.install("sgl_kernel.flash_mla")) == {"sgl_kernel.flash_mla"}
    _sgl_kernel_imports_resolve_to_the_stand_in()
    with pytest.raises(ImportError):
        from sgl_kernel import silu_and_mul  # noqa: F401 - nothing else of sglang-kernel is pretended


def test_install_for_sgl_kernel_binds_on_its_recording_stand_in(sgl_kernel_names):
    recorder = StandIns()
    recorder.reasons["sgl_kernel"] = "ModuleNotFoundError: no sglang-kernel wheel here"
    sys.meta_path.insert(0, recorder)
    try:
        importlib.import_module("sgl_kernel")  # a GPU host without the wheel: the recording stand-in
        fm.install("sgl_kernel.flash_mla")
        _sgl_kernel_imports_resolve_to_the_stand_in()
    finally:
        sys.meta_path.remove(recorder)


def test_install_refuses_an_sgl_kernel_that_loads_and_an_unknown_package(sgl_kernel_names):
    sys.modules["sgl_kernel"] = importlib.import_module("json")  # any module with a file
    with pytest.raises(RuntimeError, match="not stood in"):
        fm.install("sgl_kernel.flash_mla")
    with pytest.raises(ValueError, match="allowed: flash_mla, sgl_kernel.flash_mla"):
        fm.install("flashinfer")


def test_sglangs_own_wrapper_runs_on_the_stand_in(installed):
    pytest.importorskip("sglang")
    name = "sglang.kernels.ops.attention.flash_mla_interface"
    sys.modules.pop(name, None)
    try:
        wrapper = importlib.import_module(name)
        q, kv, indices, attn_sink, topk_length = prefill_inputs(13, 512, 2, "finite", True)
        _, max_logits, lse = wrapper.flash_mla_sparse_fwd(q, kv, indices, 0.05, 512, attn_sink, topk_length)
        _, ref_max, ref_lse = ref_sparse_prefill(q, kv, indices, 0.05, 512, attn_sink, topk_length)
        torch.testing.assert_close(max_logits.double(), ref_max * LOG2E, rtol=1e-5, atol=1e-5)  # legacy: base 2
        torch.testing.assert_close(lse.double(), ref_lse * LOG2E, rtol=1e-5, atol=1e-5)
        call, _ = decode_inputs(13, 2, "finite", True, True)
        meta, none = wrapper.get_mla_metadata()  # SGLang's _create_flashmla_metadata takes [0]
        assert isinstance(meta, fm.FlashMLASchedMeta) and none is None
        out, lse = wrapper.flash_mla_with_kvcache(tile_scheduler_metadata=meta, **call)
        assert out.shape == (3, 2, 2, 512) and meta.have_initialized
    finally:
        sys.modules.pop(name, None)  # it bound the stand-in at import
