"""The compute-sanitizer wrapper for real: racecheck finds the planted shared-memory race and
nothing in the fixed twins. A GPU machine without compute-sanitizer fails here (exit 3), never skips."""

from __future__ import annotations

import json

import pytest

from harness.cli import main

pytestmark = pytest.mark.gpu


def test_racecheck_finds_the_planted_race_and_passes_the_fixed_kernels(tmp_path):
    code = main(["sanitize", "--tool", "racecheck", "planted-race", "planted-clean", "--report-dir", str(tmp_path),
                 "--timeout", "180"])
    report = json.loads((tmp_path / "sanitizer.json").read_text())
    rows = {r["case"]: r for r in report["results"]}
    assert code == 0, [r["problem"] for r in report["results"]]
    assert rows["planted-race"]["status"] == "found" and rows["planted-race"]["findings"][0]["kind"] == "race"
    assert rows["planted-clean"]["status"] == "clean" and rows["planted-clean"]["errors"] == 0
    assert set(rows["planted-clean"]["kernels_seen"]) == {"planted_race", "planted_oob", "planted_uninit",
                                                          "planted_barrier"}
