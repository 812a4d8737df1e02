"""The Triton program behind `triton_sparse_attention`; imported only when Triton is wanted.

Kept apart from the wrapper so that importing `harness.kernels` never needs Triton, and so that
`TRITON_INTERPRET=1` (read when the kernel is decorated) takes effect whenever it is set before the
first call.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def sparse_attention_fwd(q_ptr, kv_ptr, idx_ptr, sink_ptr, out_ptr,
                         H, D, W, N, scale_log2,
                         stride_qt, stride_qh, stride_kvn, stride_it, stride_ot, stride_oh,
                         BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_D: tl.constexpr,
                         STAGES: tl.constexpr, IEEE_FP32: tl.constexpr):
    """One program per (token, head block): each gathered kv row is loaded once for all heads of
    the block and serves both Q.K and P.V (K equals V). Online softmax over W in BLOCK_W tiles, in
    base 2, seeded with the sink (score `sink`, value 0), so the running max is finite from the start
    and a row with no valid entry ends as exactly zero. A fixed tile order and no atomics make the
    result bit-reproducible. An index >= N is never dereferenced: it turns the row's output to NaN.
    The loop is a `tl.range` with its stage count: then the index load joins the software pipeline
    with the gathered kv rows (a plain `range` loads it synchronously each tile: 3.44 ms against
    2.73 ms at 8k tokens on an H200).
    """
    t = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    h_ok = offs_h < H
    d_ok = offs_d < D
    q = tl.load(q_ptr + t * stride_qt + offs_h[:, None] * stride_qh + offs_d[None, :],
                mask=h_ok[:, None] & d_ok[None, :], other=0.0)
    m = tl.load(sink_ptr + offs_h, mask=h_ok, other=0.0).to(tl.float32) * LOG2E
    l_sum = tl.full([BLOCK_H], 1.0, tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    n_bad = tl.zeros([BLOCK_W], tl.int32)
    for w0 in tl.range(0, W, BLOCK_W, num_stages=STAGES):
        offs_w = w0 + tl.arange(0, BLOCK_W)
        idx = tl.load(idx_ptr + t * stride_it + offs_w, mask=offs_w < W, other=-1)
        n_bad += (idx >= N).to(tl.int32)
        valid = (idx >= 0) & (idx < N)
        kv = tl.load(kv_ptr + idx.to(tl.int64)[:, None] * stride_kvn + offs_d[None, :],
                     mask=valid[:, None] & d_ok[None, :], other=0.0)
        if IEEE_FP32:
            s = tl.dot(q, tl.trans(kv), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(kv))
        s = tl.where(valid[None, :], s * scale_log2, float("-inf"))
        m_tile = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp2(m - m_tile)
        acc = acc * alpha[:, None]
        l_sum = l_sum * alpha
        m = m_tile
        p = tl.exp2(s - m[:, None])
        l_sum += tl.sum(p, 1)
        if IEEE_FP32:
            acc += tl.dot(p, kv, input_precision="ieee")
        else:
            acc += tl.dot(p.to(kv.dtype), kv)
    out = acc / l_sum[:, None]
    out = tl.where(tl.sum(n_bad, 0) > 0, float("nan"), out)
    tl.store(out_ptr + t * stride_ot + offs_h[:, None] * stride_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=h_ok[:, None] & d_ok[None, :])
