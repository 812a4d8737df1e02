"""The kill table in the ci profile: every seeded bug is caught within 200 examples, by the oracle
its definition expects among others, and shrinks to a replayable minimal case."""

from __future__ import annotations

import pytest

from harness.campaign import run_campaign
from harness.mutants import MUTANTS, mutant_target


@pytest.mark.parametrize("semantics", ["0.5.23", "pr"])
@pytest.mark.parametrize("name", list(MUTANTS))
def test_mutant_is_killed(name, semantics, harness_device):
    if harness_device == "cuda":
        pytest.skip("on CUDA the kill table runs each mutant in its own process: python -m harness mutants --device cuda")
    result = run_campaign(mutant_target(name), device=harness_device, semantics=semantics, examples=200,
                          profile="ci", mutant=name)
    assert result.findings, f"{name} ({MUTANTS[name].description}) survived 200 examples"
    oracles = {f.oracle for f in result.findings}
    assert MUTANTS[name].expected_oracle in oracles, (MUTANTS[name].expected_oracle, oracles)
    assert result.first_detection_examples <= 200
    assert f"--mutant {name}" in result.minimal.replay
