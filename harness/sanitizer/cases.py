"""The named programs the sanitizer runs: our kernels on a few geometries, eager and graph replay,
and the planted bugs that prove each tool still finds what it must.

A case's `run()` executes in the driver subprocess, under the sanitizer, and returns the names of the
kernels it launched; the driver writes them to a sentinel file only after `torch.cuda.synchronize()`
returned, which is the proof that they ran to completion under the tool.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from harness.case import Batch, Case, Mutation, Request
from harness.engine import run_case
from harness.errors import InvalidArgument
from harness.kernels.sparse_attention import triton_sparse_attention
from harness.model.attention import sparse_attention
from harness.sanitizer import planted, sglang_cases
from harness.targets import ReferenceTarget

TOOLS = ("racecheck", "synccheck", "memcheck", "initcheck")
CLEAN = "clean"
# The finding kind each planted kernel must produce, and the one tool that must produce it.
PLANTED = {"planted_race": ("racecheck", "race"), "planted_oob": ("memcheck", "out-of-bounds"),
           "planted_uninit": ("initcheck", "uninitialized-read"), "planted_barrier": ("synccheck", "barrier")}
ATTENTION_GEOMETRIES = {"t5": {"tokens": 5, "heads": 2, "dim": 64, "slots": 40, "width": 16},
                        "t33": {"tokens": 33, "heads": 4, "dim": 64, "slots": 300, "width": 64}}
METADATA_GEOMETRIES = {"2req": ((0, 4), (3, 5)), "3req": ((12, 6), (0, 9), (140, 3))}


@dataclass(frozen=True)
class SanitizerCase:
    name: str
    run: Callable[[], list[str]]
    tools: tuple[str, ...] = TOOLS
    expected_kind: str | None = None  # a planted bug's finding kind; None for a clean case
    kernel_regex: str | None = None  # the tool checks only kernels whose mangled name matches
    graph: bool = False  # capture needs PyTorch's caching allocator, so memcheck runs with it on here
    target: str = "reference"  # the target whose code the case runs; "any" for the tools' positive controls
    finding_in: str | None = None  # the kernels a planted bug's finding must name; default kernel_regex

    @property
    def expected(self) -> str:
        return self.expected_kind or CLEAN


def triton_kernel_names() -> list[str]:
    """The Triton kernels behind harness.kernels' sparse attention (the functions its kernel module
    decorates with `triton.jit`), or [] when Triton is not installed. Read from the module's source, not
    by importing it: this module is imported by every command, and importing triton decides once per
    process whether its kernels are interpreted (`sglang_target.api.prepare_triton` must decide first)."""
    if importlib.util.find_spec("triton") is None:
        return []
    source = Path(importlib.util.find_spec("harness.kernels._sparse_attention_kernel").origin).read_text()
    return sorted(node.name for node in ast.walk(ast.parse(source)) if isinstance(node, ast.FunctionDef)
                  and any(ast.unparse(d).startswith("triton.jit") for d in node.decorator_list))


def _attention_inputs(tokens: int, heads: int, dim: int, slots: int, width: int):
    """Built on the host and copied over, so initcheck sees them written whatever kernels it filters."""
    gen = torch.Generator().manual_seed(tokens)
    q = torch.randn(tokens, heads, dim, generator=gen)
    kv = torch.randn(slots, dim, generator=gen)
    indices = torch.randint(0, slots, (tokens, width), generator=gen, dtype=torch.int32)
    indices[:, width // 2:][torch.rand(tokens, width - width // 2, generator=gen) < 0.3] = -1
    sink = torch.randn(heads, generator=gen)
    return [t.to("cuda") for t in (q, kv, indices, sink)], dim ** -0.5


def _attention(geometry: str, graph: bool) -> Callable[[], list[str]]:
    def run() -> list[str]:
        names = triton_kernel_names()
        if names:
            kernel = triton_sparse_attention
        else:  # no Triton here: the torch twin, with every kernel checked
            kernel, names = sparse_attention, ["torch:sparse_attention"]
        (q, kv, indices, sink), scale = _attention_inputs(**ATTENTION_GEOMETRIES[geometry])
        if graph:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                kernel(q, kv, indices, sink, scale)  # warm-up (compiles) outside the capture
            torch.cuda.current_stream().wait_stream(side)
            cuda_graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(cuda_graph):
                out = kernel(q, kv, indices, sink, scale)
            cuda_graph.replay()
        else:
            out = kernel(q, kv, indices, sink, scale)
        torch.cuda.synchronize()
        want = sparse_attention(q.cpu().double(), kv.cpu().double(), indices.cpu(), sink.cpu().double(), scale)
        err = (out.cpu().double() - want).abs().max().item()
        if not err < 1e-3:
            raise AssertionError(f"attention output differs from the float64 reference by {err:.3g}")
        return names

    return run


def _metadata(geometry: str, graph: bool) -> Callable[[], list[str]]:
    def run() -> list[str]:
        requests = tuple(Request(p, e) for p, e in METADATA_GEOMETRIES[geometry])
        case = Case(batches=(Batch(requests=requests, graph=graph, mutations=(Mutation("swa_clear", count=2),)),))
        result = run_case(ReferenceTarget(), case, "cuda")
        if result.findings:
            raise AssertionError(f"the harness's own oracles failed under the sanitizer: {result.findings[0].message}")
        return [f"reference:prefill({'graph' if graph else 'eager'})"]

    return run


def _planted(bug: str | None) -> Callable[[], list[str]]:
    def run() -> list[str]:
        return planted.run(bug)

    return run


def _build() -> dict[str, SanitizerCase]:
    cases = {}
    triton_regex = "|".join(triton_kernel_names()) or None
    for geometry in ATTENTION_GEOMETRIES:
        for graph in (False, True):
            name = f"attention-{'graph' if graph else 'eager'}-{geometry}"
            cases[name] = SanitizerCase(name, _attention(geometry, graph), graph=graph, kernel_regex=triton_regex)
    for geometry in METADATA_GEOMETRIES:
        for graph in (False, True):
            name = f"metadata-{'graph' if graph else 'eager'}-{geometry}"
            cases[name] = SanitizerCase(name, _metadata(geometry, graph), graph=graph)
    cases["planted-clean"] = SanitizerCase("planted-clean", _planted(None), kernel_regex="planted_", target="any")
    for kernel, (tool, kind) in PLANTED.items():
        name = kernel.replace("_", "-")
        cases[name] = SanitizerCase(name, _planted(kernel), tools=(tool,), expected_kind=kind, kernel_regex=kernel,
                                    target="any")
    for graph in (False, True):
        mode = "graph" if graph else "eager"
        cases[f"sglang-kernels-{mode}"] = SanitizerCase(f"sglang-kernels-{mode}", sglang_cases.kernels_case(graph),
                                                        graph=graph, target="sglang")
        cases[f"sglang-prefill-{mode}"] = SanitizerCase(f"sglang-prefill-{mode}", sglang_cases.prefill_case(graph),
                                                        graph=graph, target="sglang")
    for name, (tool, kind, kernel, _) in sglang_cases.PLANTED_EDITS.items():
        cases[name] = SanitizerCase(name, sglang_cases.planted_case(name), tools=(tool,), expected_kind=kind,
                                    target="sglang", finding_in=kernel)
    return cases


CASES = _build()


def cases_of(target: str) -> list[SanitizerCase]:
    """The cases `sanitize --target TARGET` runs: the target's own, then the tools' positive controls."""
    return [c for c in CASES.values() if c.target == target] + [c for c in CASES.values() if c.target == "any"]


def get_case(name: str) -> SanitizerCase:
    if name not in CASES:
        raise InvalidArgument(f"sanitizer case {name!r} is not one of: {', '.join(CASES)}")
    return CASES[name]
