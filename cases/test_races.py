"""Race cases: the planted bugs of the race-engine issue are found by the campaign within the
default example budget, and the target under test (`--harness-target`, the clean reference by
default) is never flagged."""

from __future__ import annotations

import pytest

from harness.campaign import run_campaign
from harness.targets import TargetSpec

PLANTED = ["snapshot_skipped", "event_before_snapshot", "eagle_publishes", "snapshot_is_view",
           "scheduler_no_wait", "event_on_wrong_stream", "pool_reuse_before_barrier"]


@pytest.mark.parametrize("semantics", ["0.5.23", "pr"])
def test_the_target_has_no_finding(semantics, harness_target, harness_device):
    if semantics not in harness_target.semantics_supported:
        pytest.skip(f"target {harness_target.name} implements {', '.join(harness_target.semantics_supported)} only")
    result = run_campaign(harness_target, device=harness_device, semantics=semantics, examples=150, shrink=False)
    assert result.cases == 150
    assert not result.findings, result.summary()["findings"]


@pytest.mark.parametrize("name", PLANTED)
def test_planted_bug_is_found_and_shrinks(name, mutant_target, harness_device):
    result = run_campaign(mutant_target(name), device=harness_device, examples=200, target_spec=TargetSpec(mutant=name))
    assert result.findings, f"{name} survived 200 examples"
    minimal = result.minimal.case
    assert sum(len(b.requests) for b in minimal.batches) <= 2, minimal.summary()
    assert "python -m harness replay" in result.minimal.replay and "--mutant " + name in result.minimal.replay
