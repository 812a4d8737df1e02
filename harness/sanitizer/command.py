"""The compute-sanitizer command line for one tool and one case, with what PyTorch and Triton need.

- memcheck and initcheck run with PyTorch's caching allocator off (PYTORCH_NO_CUDA_MEMORY_CACHING=1):
  each tensor is then its own cudaMalloc, so an access past a tensor's end leaves its allocation
  instead of landing in cached memory the tool thinks valid. CUDA-graph cases keep the allocator on,
  because capture allocates from its private pools and a raw cudaMalloc during capture is illegal.
- `--kernel-name regex=...` restricts the tool to our kernels, so racecheck and initcheck do not
  spend minutes instrumenting every PyTorch kernel of the setup.
- `--target-processes all`: Triton and PyTorch may start helper processes.
- `--launch-timeout`: importing torch under the tool can take longer than the 10 s default.
- `--xml --save FILE`: the structured result we parse; `--log-file` keeps the text (with the summary
  line we cross-check) apart from the program's own output.
- `--error-exitcode`: a distinct exit code for "the tool found errors", apart from the program's.
- `--print-limit`: the XML holds at most this many records; the summary line still counts them all.
- racecheck `--racecheck-report hazard`: one record per hazard with both threads and the block; the
  default "analysis" report folds them into one line without threads.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.errors import InvalidArgument
from harness.sanitizer.cases import TOOLS, SanitizerCase

ERROR_EXITCODE = 86
PRINT_LIMIT = 100
DEFAULT_LAUNCH_TIMEOUT = 120
BASE_PORT = 49152
PORTS_PER_RUN = 10  # compute-sanitizer's --max-connections default: the ports one run may probe
_ROOT = Path(__file__).resolve().parents[2]  # the checkout holding `harness`, for the driver's imports


@dataclass(frozen=True)
class Invocation:
    argv: list[str]
    env: dict[str, str]
    xml_path: Path
    log_path: Path
    sentinel_path: Path


def driver_argv(case: SanitizerCase, sentinel: Path) -> list[str]:
    return [sys.executable, "-m", "harness.sanitizer.driver", case.name, "--sentinel", str(sentinel)]


def driver_env(tool: str | None, case: SanitizerCase) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH", "")) if p)
    if tool in ("memcheck", "initcheck") and not case.graph:
        env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    return env


def build_command(binary: str, tool: str, case: SanitizerCase, out_dir: Path, *, slot: int = 0,
                  launch_timeout: int = DEFAULT_LAUNCH_TIMEOUT) -> Invocation:
    """`slot` spaces the ports of runs that share the machine at the same time."""
    if tool not in TOOLS:
        raise InvalidArgument(f"tool={tool!r} is not one of: {', '.join(TOOLS)}, all")
    stem = out_dir / f"{tool}-{case.name}"
    xml, log, sentinel = (stem.with_name(stem.name + suffix) for suffix in (".xml", ".log", ".sentinel.json"))
    argv = [binary, "--tool", tool, "--target-processes", "all", "--launch-timeout", str(launch_timeout),
            "--port", str(BASE_PORT + PORTS_PER_RUN * slot), "--error-exitcode", str(ERROR_EXITCODE),
            "--show-backtrace", "device", "--print-limit", str(PRINT_LIMIT), "--xml", "--save", str(xml), "--log-file", str(log)]
    if case.kernel_regex:
        argv += ["--kernel-name", f"regex={case.kernel_regex}"]
    if tool == "racecheck":
        argv += ["--racecheck-report", "hazard"]
    return Invocation(argv + driver_argv(case, sentinel), driver_env(tool, case), xml, log, sentinel)
