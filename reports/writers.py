"""Report files, written so that a killed run never leaves a half-written file that looks whole.

Each file is written to a temporary sibling, flushed to disk, then renamed over the target in one
step (`os.replace` is atomic on POSIX and Windows): a reader sees the old file or the new one, never
a prefix of the new one. A failure on the way removes the temporary file and leaves the target as
it was.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path


def write_bytes_atomically(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")  # the umask's permissions
    try:
        with open(tmp, "xb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomically(path: Path, text: str) -> None:
    write_bytes_atomically(path, text.encode("utf-8"))


def write_json_atomically(path: Path, data) -> None:
    write_text_atomically(path, json.dumps(data, indent=2) + "\n")
