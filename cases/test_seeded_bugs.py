"""The kill table in the ci profile: every seeded bug is caught within 200 examples, by the oracle
its definition expects among others, and shrinks to a replayable minimal case."""

from __future__ import annotations

import pytest

from harness.kill_table import judge_mutant
from harness.mutants.corpus import MUTANTS


@pytest.mark.parametrize("semantics", ["0.5.23", "pr"])
@pytest.mark.parametrize("name", list(MUTANTS))
def test_mutant_is_killed(name, semantics, harness_device):
    if harness_device == "cuda":
        pytest.skip("on CUDA the kill table runs each mutant in its own process: python -m harness mutants --device cuda")
    row = judge_mutant(name, device=harness_device, semantics=semantics, examples=200)
    assert row["killed"], f"{name} ({MUTANTS[name].description}) survived 200 examples and the contract probes"
    assert MUTANTS[name].expected_oracle in row["oracles"], (MUTANTS[name].expected_oracle, row["oracles"])
    if row["examples_to_detect"] is not None:
        assert row["examples_to_detect"] <= 200
        assert f"--mutant {name}" in row["replay"]
