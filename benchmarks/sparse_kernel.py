"""The Triton sparse-attention kernel against the plain torch implementation at DSV4's real sizes
(64 heads, 512 dims, top-k 512 + window 128), and against this GPU's own ceilings measured in the
same run: a large device-to-device copy (bandwidth) and a bf16 matmul (FLOP rate).

    python benchmarks/sparse_kernel.py [--tokens 8192 16384 32768] [--sweep] [--out FILE]

Bytes are those the kernel actually moves: q and out once, the index row and every valid gathered
kv row once per (token, head-block) program, the sink. FLOPs are the useful ones: 4*H*D per valid
entry (Q.K and P.V). The roofline is min(copy bandwidth * arithmetic intensity, matmul rate).
The torch figures use the same byte and FLOP counts, so they are equivalent rates, not its traffic.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import torch

from harness.errors import EnvironmentBroken
from harness.kernels import (
    CANDIDATES,
    KernelConfig,
    available,
    default_config,
    triton_sparse_attention,
)
from harness.kernels.workload import dsv4_inputs
from harness.model.attention import sparse_attention

HEADS, DIM, TOPK, WINDOW = 64, 512, 512, 128


def bench_ms(fn, slow: bool = False) -> float:
    """Median over repeated runs with the L2 flushed between them (triton.testing.do_bench)."""
    import triton.testing

    if slow:
        return triton.testing.do_bench(fn, warmup=1, rep=1, return_mode="median")
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def copy_rate() -> tuple[int, float]:
    nbytes = 4 << 30
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * nbytes, bench_ms(lambda: dst.copy_(src))


def matmul_rate(n: int = 8192) -> tuple[int, float]:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    return 2 * n ** 3, bench_ms(lambda: a @ b)


def ceilings() -> dict:
    moved, copy_ms = copy_rate()
    flops, mm_ms = matmul_rate()
    return {"copy_bytes": moved, "copy_ms": copy_ms, "copy_GBps": moved / copy_ms / 1e6,
            "matmul_flops": flops, "matmul_ms": mm_ms, "matmul_TFLOPs": flops / mm_ms / 1e9}


def traffic(q, kv, idx, block_h: int) -> tuple[int, int]:
    """(bytes moved, useful FLOPs) for one call with head blocks of block_h."""
    tokens, heads, dim = q.shape
    valid = int((idx >= 0).sum().item())
    blocks = -(-heads // block_h)
    elt = q.element_size()
    moved = (2 * tokens * heads * dim * elt + blocks * valid * dim * elt
             + blocks * idx.numel() * idx.element_size() + blocks * tokens * block_h * 4)
    return moved, 4 * heads * dim * valid


def rates(ms: float, moved: int, flops: int, ceil: dict) -> dict:
    intensity = flops / moved
    roof = min(ceil["copy_GBps"] * 1e9 * intensity, ceil["matmul_TFLOPs"] * 1e12)
    achieved = flops / (ms * 1e-3)
    return {"ms": ms, "GBps": moved / ms / 1e6, "TFLOPs": achieved / 1e12, "flop_per_byte": intensity,
            "roofline_TFLOPs": roof / 1e12, "pct_roofline": 100 * achieved / roof}


def cfg_dict(cfg: KernelConfig) -> dict:
    return {"block_h": cfg.block_h, "block_w": cfg.block_w, "num_warps": cfg.num_warps,
            "num_stages": cfg.num_stages}


def precompile(configs) -> list[str]:
    """Compile every config at once in worker processes; Triton's disk cache then serves the timing."""
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(len(configs), os.cpu_count() or 1), mp_context=ctx) as pool:
        return list(pool.map(compile_one, configs))


def compile_one(cfg: KernelConfig) -> str:
    # 64 tokens give the same integer specialisations (multiples of 16) as the timed sizes
    try:
        q, kv, idx, sink, scale = dsv4_inputs(64, heads=HEADS, head_dim=DIM, device="cuda")
        triton_sparse_attention(q, kv, idx, sink, scale, config=cfg)
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - reported per config; the sweep records it again
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    return "ok"


def sweep(tokens: int, ceil: dict, budget_s: float, log) -> list[dict]:
    q, kv, idx, sink, scale = dsv4_inputs(tokens, device="cuda")
    out = torch.empty_like(q)
    start = time.monotonic()
    compiled = precompile(CANDIDATES)
    log(f"  compiled {len(CANDIDATES)} configs in {time.monotonic() - start:.0f}s: {compiled}")
    rows = []
    for cfg in CANDIDATES:
        if time.monotonic() - start > budget_s:
            rows.append({"config": cfg_dict(cfg), "skipped": f"sweep budget {budget_s:.0f}s spent"})
            continue
        try:
            ms = bench_ms(lambda cfg=cfg: triton_sparse_attention(q, kv, idx, sink, scale, out=out, config=cfg))
        except Exception as exc:  # noqa: BLE001 - a config that does not fit (smem, registers) must not end the sweep
            rows.append({"config": cfg_dict(cfg), "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
            log(f"  {cfg}: {rows[-1]['error']}")
            continue
        moved, flops = traffic(q, kv, idx, cfg.block_h)
        rows.append({"config": cfg_dict(cfg), "tokens": tokens, **rates(ms, moved, flops, ceil)})
        log(f"  {cfg}: {ms:.3f} ms, {rows[-1]['TFLOPs']:.0f} TFLOP/s, {rows[-1]['pct_roofline']:.0f}% of roofline")
    return rows


def compiled_stats() -> list[dict]:
    """Registers, spills and shared memory of each compiled variant: the evidence behind a config."""
    from harness.kernels._sparse_attention_kernel import sparse_attention_fwd

    stats = []
    try:
        for caches in sparse_attention_fwd.device_caches.values():
            for kernel in caches[0].values():
                kernel._init_handles()
                constants = {str(k): v for k, v in kernel.src.constants.items() if not str(v).startswith("<")}
                stats.append({"constants": constants, "num_warps": kernel.metadata.num_warps,
                              "num_stages": kernel.metadata.num_stages, "shared": kernel.metadata.shared,
                              "n_regs": kernel.n_regs, "n_spills": kernel.n_spills})
    except (AttributeError, TypeError, IndexError) as exc:  # Triton internals: say so rather than guess
        stats.append({"error": f"this Triton's compiled-kernel cache is not readable: {exc!r}"})
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[8192, 16384, 32768])
    parser.add_argument("--sweep", action="store_true", help="time every config of CANDIDATES first (at the first size)")
    parser.add_argument("--sweep-budget", type=float, default=60.0, help="seconds the sweep may take")
    parser.add_argument("--out", default="benchmarks/sparse_kernel.json")
    args = parser.parse_args()
    if not available():
        raise EnvironmentBroken("the sparse-kernel benchmark needs triton and a CUDA device")
    import triton

    def log(line: str) -> None:
        print(line, flush=True)

    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "shape": {"heads": HEADS, "dim": DIM, "topk": TOPK, "window": WINDOW, "dtype": "bfloat16"}}

    def save() -> None:  # after every section, so a run cut short still leaves its figures
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=1)

    result["ceilings"] = ceil = ceilings()
    log(f"{result['device']}: copy {ceil['copy_GBps']:.0f} GB/s, bf16 matmul {ceil['matmul_TFLOPs']:.0f} TFLOP/s")
    save()
    cfg = default_config(HEADS, DIM, torch.bfloat16)
    best = None
    if args.sweep:
        log(f"sweep at {args.tokens[0]} tokens:")
        result["sweep"] = sweep(args.tokens[0], ceil, args.sweep_budget, log)
        timed = [r for r in result["sweep"] if "ms" in r]
        if timed:
            fastest = min(timed, key=lambda r: r["ms"])["config"]
            best = None if fastest == cfg_dict(cfg) else KernelConfig(**fastest)
            result["best_config"] = fastest
        save()
    result["config"] = cfg_dict(cfg)
    result["rows"] = []
    for tokens in args.tokens:
        result["rows"].append(measure(tokens, cfg, best, ceil))
        log(f"{tokens} tokens: triton {result['rows'][-1]['triton']['ms']:.3f} ms")
        save()
    result["compiled"] = compiled_stats()
    save()
    for entry in result["compiled"]:
        log(f"compiled: {entry}")
    print_tables(result)


def measure(tokens: int, cfg: KernelConfig, best: KernelConfig | None, ceil: dict) -> dict:
    """One size: the kernel at the default config (and the sweep's best), and the torch version."""
    q, kv, idx, sink, scale = dsv4_inputs(tokens, device="cuda")
    out = torch.empty_like(q)
    moved, flops = traffic(q, kv, idx, cfg.block_h)
    t_ms = bench_ms(lambda: triton_sparse_attention(q, kv, idx, sink, scale, out=out, config=cfg))
    row = {"tokens": tokens, "triton": rates(t_ms, moved, flops, ceil)}
    if best is not None:
        b_ms = bench_ms(lambda: triton_sparse_attention(q, kv, idx, sink, scale, out=out, config=best))
        row["triton_best"] = rates(b_ms, traffic(q, kv, idx, best.block_h)[0], flops, ceil)
    torch_ms = bench_ms(lambda: sparse_attention(q, kv, idx, sink, scale), slow=True)
    row["torch"] = rates(torch_ms, traffic(q, kv, idx, q.shape[1])[0], flops, ceil)
    return row


def print_tables(result: dict) -> None:
    ceil = result["ceilings"]
    head = (f"{result['device']}: copy {ceil['copy_GBps']:.0f} GB/s, bf16 matmul {ceil['matmul_TFLOPs']:.0f} "
            f"TFLOP/s; config {result['config']}")
    print(head)
    print(f"{'tokens':>7} {'impl':>11} {'ms':>9} {'GB/s':>8} {'TFLOP/s':>8} {'FLOP/B':>7} {'roof':>6} {'%roof':>6}")
    if "best_config" in result:
        print(f"triton_best: the sweep's fastest config {result['best_config']}")
    for row in result["rows"]:
        for impl in ("triton", "triton_best", "torch"):
            if impl not in row:
                continue
            r = row[impl]
            print(f"{row['tokens']:>7} {impl:>11} {r['ms']:>9.3f} {r['GBps']:>8.0f} {r['TFLOPs']:>8.1f} "
                  f"{r['flop_per_byte']:>7.1f} {r['roofline_TFLOPs']:>6.0f} {r['pct_roofline']:>5.1f}%")
    print("\nmarkdown (BENCHMARKS.md):\n")
    print("| tokens | Triton ms | GB/s | TFLOP/s | % of roofline | torch ms | speed-up |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for row in result["rows"]:
        t, p = row["triton"], row["torch"]
        print(f"| {row['tokens']} | {t['ms']:.2f} | {t['GBps']:.0f} | {t['TFLOPs']:.0f} | {t['pct_roofline']:.0f}% "
              f"| {p['ms']:.1f} | {p['ms'] / t['ms']:.0f}x |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
