"""Defaults from the project's pyproject.toml, under `[tool.dsv4-harness]`; the command line wins.

    [tool.dsv4-harness]
    target = "sglang"
    semantics = "0.5.23"
    profile = "nightly"
    report-dir = "nightly-report"

The file is the first pyproject.toml found from the working directory upward, as pytest and ruff
look for theirs. A key that is not known, or a value that is not allowed, is refused before any
work (exit 2) with the key named, never ignored: a typo in a nightly's configuration must not run
the wrong campaign quietly.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from harness.choices import PROFILES
from harness.case import SEMANTICS
from harness.errors import InvalidArgument

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

TABLE = "tool.dsv4-harness"
KEYS = {"target": "target", "semantics": "semantics", "profile": "profile", "report-dir": "report_dir"}


def find_pyproject(start: Optional[Path] = None) -> Optional[Path]:
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def _check(path: Path, key: str, value) -> str:
    where = f"{path.name} [{TABLE}] {key}"
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{where} = {value!r}: must be a non-empty string")
    allowed = {"semantics": SEMANTICS, "profile": PROFILES}.get(key)
    if allowed and value not in allowed:
        raise InvalidArgument(f"{where} = {value!r} is not one of: {', '.join(allowed)}")
    if key == "target" and value not in ("reference", "sglang") and ":" not in value:
        raise InvalidArgument(f"{where} = {value!r} is not one of: reference, sglang, MODULE:FACTORY")
    return value


def project_defaults(pyproject: Optional[Path]) -> dict[str, str]:
    """argparse destinations -> values from the file's table ({} without a file or a table)."""
    if pyproject is None:
        return {}
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"{pyproject}: not valid TOML ({exc})") from None
    table = data.get("tool", {}).get("dsv4-harness")
    if table is None:
        return {}
    if not isinstance(table, dict):
        raise InvalidArgument(f"{pyproject.name} [{TABLE}]: must be a table")
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise InvalidArgument(f"{pyproject.name} [{TABLE}]: unknown key(s) {', '.join(unknown)}; allowed: "
                              f"{', '.join(KEYS)}")
    return {KEYS[key]: _check(pyproject, key, value) for key, value in table.items()}
