"""JSON report files, written so that a killed run never leaves a half-written file that looks whole."""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_json_atomically(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)
