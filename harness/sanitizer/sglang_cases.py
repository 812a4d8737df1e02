"""The sanitizer cases of `--target sglang`: SGLang's own DSV4 prefill kernels under the tools.

SGLang 0.5.23's sparse-prefill path launches two Triton kernels of its own
(`kernels/ops/attention/dsv4/sparse_prefill_kernels.py`): `_build_swa_token_ids_kernel` (each
request's SWA window, translated through `req_to_token` and Full-to-SWA) and
`_combine_topk_swa_indices_kernel` (each query row's [top-k | window | -1] indices). These cases run
them as SGLang calls them, from the installed package, never a copy:

- `kernels`: `build_swa_token_ids` and `combine_topk_swa_indices` (positional and explicit SWA) on two
  geometries (a small window; DSV4's 512 top-k and 128 window, whose combined width of 640 is not a
  power of two, so the kernel's padded block is masked), eagerly or captured into a CUDA graph with
  static inputs and outputs and replayed over rewritten inputs, as a graph runner replays; each output
  is checked against what the functions' docstrings specify, computed here with torch on the host;
- `prefill`: a whole harness case through `--target sglang` (the real runner, backend, chunk cache and
  publisher), whose oracles must stay quiet;
- planted bugs: the same kernel case over a copy of SGLang's kernel file with one edit that a tool must
  find (`PLANTED_EDITS`): an edit that no longer matches the installed source is an error, never a
  pass.

Each case returns the SGLang kernels it saw launched (`launched_kernels`), so a path that stopped
reaching them is a `never-ran` failure, not a clean run. The tools check every kernel of these cases,
PyTorch's too (no `--kernel-name` filter): initcheck does not see what a filtered-out kernel writes, so
SGLang's kernels would read the metadata PyTorch's ops computed for them as uninitialized, and a planted
uninitialized read would be found with or without its edit.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Callable, Iterator

import torch

from harness.case import Batch, Case, Mutation, Request
from harness.device import DeviceKind
from harness.engine import run_case
from harness.errors import EnvironmentBroken
from harness.sglang_target.api import KERNELS as KERNEL_MODULE
from harness.sglang_target.api import TRITON_KERNELS as SGLANG_KERNELS
from harness.sglang_target.api import prepare_triton
from harness.strategies import with_contract, with_dims
from harness.targets import TargetSpec

# name -> (tool, finding kind, kernel, (old, new)): one textual edit of SGLang's kernel file.
PLANTED_EDITS = {
    "sglang-planted-oob": ("memcheck", "out-of-bounds", "_combine_topk_swa_indices_kernel",
                           ("        mask=valid[:, None] & (offset < WIDTH),\n", "        mask=valid[:, None],\n")),
    "sglang-planted-uninit": ("initcheck", "uninitialized-read", "_build_swa_token_ids_kernel",
                              ("    swa_offsets = torch.zeros(num_reqs + 1, dtype=torch.int32, device=device)\n",
                               "    swa_offsets = torch.empty(num_reqs + 1, dtype=torch.int32, device=device)\n")),
}
# (seq_len, extend_len) per request, the SWA window, the top-k width, the compress ratio.
GEOMETRIES = {"small": (((18, 6), (9, 9), (143, 3)), 8, 16, 4),
              "dsv4": (((700, 40), (130, 130), (2100, 9)), 128, 512, 4)}


def kernel_module() -> ModuleType:
    """The installed SGLang kernel module (Triton interpreted on a machine without a GPU)."""
    prepare_triton()
    try:
        return importlib.import_module(KERNEL_MODULE)
    except ImportError as exc:
        raise EnvironmentBroken(f"--target sglang: cannot import {KERNEL_MODULE} ({exc}); install sglang 0.5.23 "
                                f"as harness/sglang_target/__init__.py says") from None


def edited_source(label: str, old: str, new: str) -> str:
    """SGLang's kernel file with one edit, which must match the installed source exactly once."""
    source = Path(kernel_module().__file__).read_text()
    if source.count(old) != 1:
        raise EnvironmentBroken(f"sanitizer case {label}: its edit matches {source.count(old)} place(s) in "
                                f"{KERNEL_MODULE}, not one: the installed SGLang changed, the planted bug never ran")
    return source.replace(old, new)


def edited_module(label: str, old: str, new: str) -> ModuleType:
    """A copy of SGLang's kernel module with one edit, loaded from a file of its own (Triton reads a
    kernel's source from its file)."""
    path = Path(tempfile.mkdtemp(prefix="sglang-planted-")) / f"{label.replace('-', '_')}.py"
    path.write_text(edited_source(label, old, new))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def launched_kernels(module: ModuleType) -> Iterator[list[str]]:
    """The names of SGLang's kernels launched from `module` while inside, in launch order (first launch)."""
    seen: list[str] = []
    originals = {name: getattr(module, name) for name in SGLANG_KERNELS}

    class Counted:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            if self.kernel.__name__ not in seen:
                seen.append(self.kernel.__name__)
            return self.kernel[grid]

    for name, kernel in originals.items():
        setattr(module, name, Counted(kernel))
    try:
        yield seen
    finally:
        for name, kernel in originals.items():
            setattr(module, name, kernel)


# -- the kernels' inputs and what their docstrings say they return -------------------------------------------

def _inputs(geometry: str, device, seed: int):
    requests, window, topk, ratio = GEOMETRIES[geometry]
    gen = torch.Generator().manual_seed(seed)
    seq = torch.tensor([s for s, _ in requests], dtype=torch.int32)
    ext = torch.tensor([e for _, e in requests], dtype=torch.int32)
    rows, width = len(requests) + 2, int(seq.max()) + 4
    req_to_token = torch.randperm(rows * width, generator=gen).to(torch.int32).reshape(rows, width)
    full_to_swa = torch.randint(0, 1 << 20, (rows * width + 1,), generator=gen, dtype=torch.int64)
    req_pool_indices = torch.randperm(rows, generator=gen)[: len(requests)].to(torch.int32)
    query_start_loc = torch.zeros(len(requests) + 1, dtype=torch.int32)
    query_start_loc[1:] = torch.cumsum(ext, 0)
    query_pos = torch.cat([torch.arange(s - e, s, dtype=torch.int32) for s, e in requests])
    tokens = int(ext.sum())
    topk_indices = torch.full((tokens, topk), -1, dtype=torch.int32)
    for t in range(tokens):
        valid = min((int(query_pos[t]) + 1) // ratio, topk)
        if valid:
            topk_indices[t, :valid] = torch.randint(0, valid, (valid,), generator=gen, dtype=torch.int32)
            topk_indices[t, :valid][torch.rand(valid, generator=gen) < 0.2] = -1
    gather = torch.minimum(seq, ext + (window - 1))
    c_max = max(1, int(seq.max()) // ratio)
    compressed_base = (torch.arange(len(requests), dtype=torch.int32) * c_max).to(torch.int32)
    swa_base = (len(requests) * c_max + torch.cumsum(gather, 0) - gather).to(torch.int32)
    swa_lengths = torch.minimum(query_pos + 1, torch.tensor(window, dtype=torch.int32)).to(torch.int32)
    swa_indices = torch.randint(-1, 64, (tokens, window), generator=gen, dtype=torch.int32)
    host = dict(seq_lens=seq, extend_seq_lens=ext, req_pool_indices=req_pool_indices, req_to_token=req_to_token,
                full_to_swa=full_to_swa, query_start_loc=query_start_loc, query_pos=query_pos,
                topk_indices=topk_indices, gather_lens=gather.to(torch.int32), compressed_base=compressed_base,
                swa_base=swa_base, swa_indices=swa_indices, swa_lengths=swa_lengths)
    return {k: v.to(device) for k, v in host.items()}, window, topk, ratio


def _expected_swa_ids(x: dict, window: int):
    seq, ext = x["seq_lens"].cpu(), x["extend_seq_lens"].cpu()
    r2t, f2s, rpi = x["req_to_token"].cpu(), x["full_to_swa"].cpu(), x["req_pool_indices"].cpu()
    parts = []
    for r in range(len(seq)):
        length = min(int(seq[r]), int(ext[r]) + window - 1)
        first = int(seq[r]) - length
        parts.append(f2s[r2t[int(rpi[r]), first:first + length].long()].to(torch.int32))
    return torch.cat(parts)


def _expected_combined(x: dict, window: int, topk: int, ratio: int, explicit: bool, width: int):
    loc, pos_all = x["query_start_loc"].cpu(), x["query_pos"].cpu()
    seq, gather = x["seq_lens"].cpu(), x["gather_lens"].cpu()
    cbase, sbase = x["compressed_base"].cpu(), x["swa_base"].cpu()
    top, swa_idx, swa_len_all = x["topk_indices"].cpu(), x["swa_indices"].cpu(), x["swa_lengths"].cpu()
    tokens = len(pos_all)
    rows = torch.full((tokens, width), -1, dtype=torch.int32)
    lens = torch.zeros(tokens, dtype=torch.int32)
    for t in range(tokens):
        r = int(torch.searchsorted(loc[1:], torch.tensor(t), right=True))
        pos = int(pos_all[t])
        k = min((pos + 1) // ratio, topk)
        row = [int(v) + int(cbase[r]) if v >= 0 else -1 for v in top[t, :k]]
        if explicit:
            s = int(swa_len_all[t])
            row += [int(v) + int(sbase[r]) if v >= 0 else -1 for v in swa_idx[t, :s]]
        else:
            s = min(pos + 1, window)
            start = int(sbase[r]) + pos - s + 1 - (int(seq[r]) - int(gather[r]))
            row += list(range(start, start + s))
        rows[t, :len(row)] = torch.tensor(row, dtype=torch.int32)
        lens[t] = k + s
    return rows, lens


def _check(what: str, got, want) -> None:
    if not torch.equal(got.cpu(), want):
        bad = (got.cpu() != want).nonzero()[0].tolist()
        raise AssertionError(f"SGLang's {what} differs from its specification at {bad}: "
                             f"{got.cpu()[tuple(bad)].item()} != {want[tuple(bad)].item()}")


def _kernel_calls(module: ModuleType, x: dict, window: int, topk: int, ratio: int, total: int,
                  outputs: dict) -> dict:
    """SGLang's two functions as the chunk cache calls them (`total`: the SWA ids to allocate, from CPU
    lengths, as the chunk cache computes it), into `outputs`' buffers when given."""
    ids = module.build_swa_token_ids(seq_lens=x["seq_lens"], extend_seq_lens=x["extend_seq_lens"],
                                     req_pool_indices=x["req_pool_indices"], req_to_token=x["req_to_token"],
                                     full_to_swa=x["full_to_swa"], swa_window=window, total_swa=total)[0]
    common = dict(topk_indices=x["topk_indices"], query_start_loc=x["query_start_loc"], query_pos=x["query_pos"],
                  seq_lens=x["seq_lens"], gather_lens=x["gather_lens"], compressed_base=x["compressed_base"],
                  swa_base=x["swa_base"], window_size=window, compress_ratio=ratio, topk=topk)
    positional = module.combine_topk_swa_indices(**common, out_indices=outputs.get("positional"),
                                                 out_lens=outputs.get("positional_lens"))
    explicit = module.combine_topk_swa_indices(**common, swa_indices=x["swa_indices"], swa_lengths=x["swa_lengths"],
                                               out_indices=outputs.get("explicit"), out_lens=outputs.get("explicit_lens"))
    return {"ids": ids, "positional": positional[0], "positional_lens": positional[1],
            "explicit": explicit[0], "explicit_lens": explicit[1]}


def _judge(module: ModuleType, x: dict, window: int, topk: int, ratio: int, out: dict) -> None:
    width = module.combined_topk_width(topk, window)
    _check("build_swa_token_ids", out["ids"], _expected_swa_ids(x, window))
    for explicit in (False, True):
        name = "explicit" if explicit else "positional"
        rows, lens = _expected_combined(x, window, topk, ratio, explicit, width)
        _check(f"combine_topk_swa_indices ({name} SWA) indices", out[name], rows)
        _check(f"combine_topk_swa_indices ({name} SWA) lengths", out[f"{name}_lens"], lens)


def run_kernels(module: ModuleType, *, graph: bool, device: str = "cuda", geometries=tuple(GEOMETRIES),
                check: bool = True) -> list[str]:
    """SGLang's kernels on each geometry, eagerly or as a captured graph replayed over new inputs."""
    with launched_kernels(module) as seen:
        for geometry in geometries:
            x, window, topk, ratio = _inputs(geometry, device, seed=1)
            total = int(x["gather_lens"].sum())  # read on the host before any capture
            if not graph:
                out = _kernel_calls(module, x, window, topk, ratio, total, {})
            else:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):  # compiles SGLang's kernels outside the capture
                    warm = _kernel_calls(module, x, window, topk, ratio, total, {})
                torch.cuda.current_stream().wait_stream(side)
                cuda_graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(cuda_graph):
                    out = _kernel_calls(module, x, window, topk, ratio, total,
                                        {k: v for k, v in warm.items() if k != "ids"})
                fresh, *_ = _inputs(geometry, device, seed=2)  # same shapes, new contents, as a replay's batch
                for name, tensor in x.items():
                    tensor.copy_(fresh[name])
                cuda_graph.replay()
            if DeviceKind(device).uses_gpus:
                torch.cuda.synchronize()
            if check:
                _judge(module, x, window, topk, ratio, out)
    return seen


def run_prefill(*, graph: bool, device: str = "cuda") -> list[str]:
    """One harness case through `--target sglang`: SGLang's runner, backend, chunk cache and publisher."""
    target_spec = TargetSpec("sglang")
    target = target_spec.load()
    module = kernel_module()
    requests = (Request(12, 6), Request(0, 9), Request(140, 3))
    case = with_dims(Case(batches=(Batch(requests=requests, graph=graph, mutations=(Mutation("swa_clear", count=2),)),
                                   Batch(requests=(Request(30, 5),), graph=graph))),
                     tuple(target.fixed_dims.items()))  # at the sizes the installed release asserts
    case = with_contract(case, target.graph_contracts)  # and replayed as it replays
    with launched_kernels(module) as seen:
        result = run_case(target, case, device, target_spec=target_spec)
    if result.findings:
        raise AssertionError(f"the harness's oracles flagged clean SGLang under the sanitizer: {result.findings[0].message}")
    return seen


def kernels_case(graph: bool) -> Callable[[], list[str]]:
    return lambda: run_kernels(kernel_module(), graph=graph)


def prefill_case(graph: bool) -> Callable[[], list[str]]:
    return lambda: run_prefill(graph=graph)


def planted_case(name: str) -> Callable[[], list[str]]:
    """The kernel case over the planted copy, on the geometry whose padded block reaches past the row."""
    old, new = PLANTED_EDITS[name][3]
    return lambda: run_kernels(edited_module(name, old, new), graph=False, geometries=("dsv4",), check=False)
