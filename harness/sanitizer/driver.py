"""`python -m harness.sanitizer.driver CASE --sentinel FILE`: run one sanitizer case in this process.

The sanitizer wraps this process. The sentinel is the proof the case's kernels ran: it is written
once when they were launched and again, with `synchronized: true`, only after the device finished
them, so a run that died, hung or never launched leaves no proof behind.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

from harness.errors import HarnessError
from harness.sanitizer.cases import get_case
from reports.writers import write_json_atomically


def synchronize() -> None:
    """Device-wide, through whichever runtime the case used (a cupy-only case never starts torch's CUDA)."""
    if "cupy" in sys.modules:
        import cupy

        cupy.cuda.runtime.deviceSynchronize()
    else:
        import torch

        torch.cuda.synchronize()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.sanitizer.driver", description=__doc__)
    parser.add_argument("case")
    parser.add_argument("--sentinel", required=True, help="JSON file written when the kernels ran")
    args = parser.parse_args(argv)
    sentinel = Path(args.sentinel)
    try:
        case = get_case(args.case)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    record = {"case": case.name, "kernels": [], "synchronized": False, "body_seconds": None}
    began = time.perf_counter()
    try:
        record["kernels"] = case.run()
        write_json_atomically(sentinel, record)
        synchronize()
    except Exception as exc:  # noqa: BLE001  any failure: reported through the sentinel and the exit code
        traceback.print_exc()
        record["error"] = f"{type(exc).__name__}: {exc}"
        write_json_atomically(sentinel, record)
        return 1
    record.update(synchronized=True, body_seconds=round(time.perf_counter() - began, 4))
    write_json_atomically(sentinel, record)
    print(f"sanitizer case {case.name}: ran {', '.join(record['kernels'])}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
