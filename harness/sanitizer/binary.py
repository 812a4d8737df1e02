"""Finding compute-sanitizer: on PATH, under CUDA's install, or inside a pip package that ships it.

The report names where the binary came from, because a PATH binary and a pip wheel can differ in
version, and a version mismatch with the driver is a common cause of odd sanitizer failures.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.errors import EnvironmentBroken

NAME = "compute-sanitizer"
_VERSION = re.compile(r"Version\s+(\S+)")


@dataclass(frozen=True)
class SanitizerBinary:
    path: str
    source: str  # PATH | CUDA_HOME | pip
    version: str

    def as_dict(self) -> dict:
        return {"path": self.path, "source": self.source, "version": self.version}


def _cuda_install_candidates() -> list[Path]:
    roots = [os.environ[v] for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    roots += sorted(glob.glob("/usr/local/cuda*"), reverse=True)
    found = []
    for root in roots:
        for sub in ("bin", "compute-sanitizer"):
            found.append(Path(root) / sub / NAME)
    return found


def _pip_candidates() -> list[Path]:
    """`nvidia-cuda-sanitizer-api*` wheels put it at site-packages/nvidia/<pkg>/bin/compute-sanitizer."""
    found = []
    for entry in sys.path:
        base = Path(entry) / "nvidia"
        if base.is_dir():
            found += sorted(base.glob(f"*/bin/{NAME}")) + sorted(base.glob(f"*/{NAME}/{NAME}"))
    return found


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def read_version(path: str, timeout: float = 30.0) -> str:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EnvironmentBroken(f"{path} --version failed: {exc}") from exc
    match = _VERSION.search(out.stdout + out.stderr)
    if out.returncode != 0 or not match:
        raise EnvironmentBroken(f"{path} --version exited {out.returncode} without a version line: "
                                f"{(out.stdout + out.stderr).strip()[:200]!r}")
    return match.group(1)


def find_sanitizer() -> SanitizerBinary:
    """The first compute-sanitizer found, PATH first; EnvironmentBroken naming every place looked."""
    on_path = shutil.which(NAME)
    if on_path:
        return SanitizerBinary(on_path, "PATH", read_version(on_path))
    for source, candidates in (("CUDA_HOME", _cuda_install_candidates()), ("pip", _pip_candidates())):
        for path in candidates:
            if _executable(path):
                return SanitizerBinary(str(path), source, read_version(str(path)))
    raise EnvironmentBroken(
        f"{NAME} not found: not on PATH, not under CUDA_HOME/CUDA_PATH or /usr/local/cuda*/bin, and no pip "
        f"package ships it (site-packages/nvidia/*/bin/{NAME}). Install the CUDA toolkit or "
        f"`pip install nvidia-cuda-sanitizer-api-cu12`, or put {NAME} on PATH.")
