"""Adding an oracle is one module: a registered toy oracle runs on every case, is a valid `--oracles`
choice, and shows on the report page, with no edit to the engine, the CLI or the reports."""

from __future__ import annotations

import json

import pytest

from harness import cli
from harness.case import Batch, Case, Request
from harness.engine import explore, run_case
from harness.errors import HarnessError, InvalidArgument
from harness.findings import Finding
from harness.oracles import oracle, oracle_names, parse_oracles, unregister
from harness.targets import ReferenceTarget

PLAIN = Case(batches=(Batch(requests=(Request(3, 5),)),))
BUILT_IN = ("execution", "differential", "happens-before", "policy", "fast-path", "freshness", "float64", "kv", "reference", "contract")


@pytest.fixture
def toy():
    """A toy oracle, registered for one test: one finding per case, naming its batches."""
    judged_cases = []

    @oracle("toy", "flags every case, to show that a registered oracle runs")
    def toy_oracle(judged):
        judged_cases.append(judged.case)
        return [Finding("toy", "every-case", f"a toy finding on {len(judged.case.batches)} batch(es)",
                        details={"batches": len(judged.case.batches)})]

    yield judged_cases
    unregister("toy")


def test_the_built_in_oracles_are_registered_in_the_order_they_judge():
    assert oracle_names() == BUILT_IN


def test_a_registered_oracle_runs_on_every_judged_case(toy):
    findings = run_case(ReferenceTarget(), PLAIN).findings
    assert [(f.oracle, f.kind) for f in findings] == [("toy", "every-case")]
    assert toy == [PLAIN]
    assert run_case(ReferenceTarget(), PLAIN, oracles=frozenset({"differential"})).findings == []
    assert explore(ReferenceTarget(), PLAIN, bound=3, oracles=frozenset({"toy"})).by_oracle["toy"] >= 1


def test_a_registered_oracle_is_a_valid_oracles_choice_and_is_listed(toy):
    """Listed where a bad name is refused: `--help` names no oracle, as it loads none (nor torch)."""
    assert parse_oracles("toy,differential") == frozenset({"toy", "differential"})
    with pytest.raises(InvalidArgument, match="unknown nonsense; allowed: .*, contract, toy$"):
        parse_oracles("nonsense")


def test_an_unregistered_oracle_is_refused_with_the_registered_names():
    with pytest.raises(InvalidArgument, match="unknown toy; allowed: execution, differential, happens-before"):
        parse_oracles("toy")


def test_an_oracle_registered_twice_is_the_harness_own_error(toy):
    with pytest.raises(HarnessError, match="registered twice"):
        oracle("toy", "again")(lambda judged: [])


def test_a_registered_oracle_shows_on_the_report_page(toy, tmp_path, capsys):
    report = tmp_path / "report"
    code = cli.main(["run", "--device", "cpu", "--examples", "2", "--oracles", "toy,differential", "--no-shrink",
                     "--report-dir", str(report)])
    assert code == 1
    summary = json.loads((report / "summary.json").read_text())
    assert summary["oracles"] == ["differential", "toy"]
    assert [(f["oracle"], f["kind"]) for f in summary["findings"]] == [("toy", "every-case")]
    page = (report / "index.html").read_text()
    assert "toy/every-case" in page
    assert "<b>oracles</b>differential, toy" in page
