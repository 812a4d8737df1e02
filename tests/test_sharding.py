"""Shards of a campaign, of the kill table and of the pytest suite; merging their report folders."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from test_reports import finding, mutant_row, san_result, sanitizer, summary, write_folder

from harness.cli import main
from harness.errors import InvalidArgument
from harness.mutants.corpus import MUTANTS
from harness.overlap import BatchOverlap, FastPathOverlap
from harness.sharding import Shard
from reports.folder import load_folder
from reports.merge import merge_folders, merge_summaries
from reports.schema import SUMMARY, check_written

pytest_plugins = ["pytester"]

CAMPAIGN = ["run", "--device", "cpu", "--profile", "dev", "--seed", "11", "--examples", "24", "-q"]


def case_set(folder: Path) -> Counter:
    """The judged cases by their position in the stream and their digest (a stream may repeat a case)."""
    log = json.loads((folder / "summary.json").read_text())["cases_log"]
    return Counter((record["stream"], record["case"]) for record in log)


@pytest.mark.parametrize("text", ["0/2", "3/2", "1", "a/b", "1/0", ""])
def test_a_bad_shard_is_refused_naming_it_as_the_caller_does(text):
    with pytest.raises(InvalidArgument, match=r"^shard=.*K/N with 1 <= K <= N"):
        Shard.parse(text)
    with pytest.raises(InvalidArgument, match=r"^--shard=.*K/N with 1 <= K <= N"):
        Shard.parse(text, "--shard")


def test_the_parts_are_disjoint_and_cover_the_stream_and_workers_split_their_part():
    items = list(range(23))
    parts = [Shard(k, 4).select(items) for k in range(1, 5)]
    assert sorted(sum(parts, [])) == items and max(map(len, parts)) - min(map(len, parts)) <= 1
    second = Shard(2, 4)
    workers = [second.split(3, w).select(items) for w in (1, 2, 3)]
    assert sorted(sum(workers, [])) == second.select(items)


def test_two_cpu_shards_merged_have_exactly_the_unsharded_case_set(tmp_path, capsys):
    assert main([*CAMPAIGN, "--report-dir", str(tmp_path / "whole")]) == 0
    for k in (1, 2):
        assert main([*CAMPAIGN, "--shard", f"{k}/2", "--report-dir", str(tmp_path / f"shard{k}")]) == 0
    parts = [case_set(tmp_path / f"shard{k}") for k in (1, 2)]
    assert not set(parts[0]) & set(parts[1]), "a case was judged by both shards"
    assert main(["merge", str(tmp_path / "shard1"), str(tmp_path / "shard2"), "--into", str(tmp_path / "merged")]) == 0
    assert case_set(tmp_path / "merged") == case_set(tmp_path / "whole")
    merged = load_folder(tmp_path / "merged").summary
    assert merged["cases"] == 24 and merged["shard"] == {"index": 1, "count": 1} and merged["shards_missing"] == []
    assert [w["shard"] for w in merged["workers"]] == ["1/2", "2/2"]
    assert (tmp_path / "merged" / "index.html").is_file() and (tmp_path / "merged" / "junit-campaign.xml").is_file()


def shard_summary(k: int, n: int, findings=(), **extra) -> dict:
    return {**summary(findings, cases=3), "shard": {"index": k, "count": n}, **extra}


def test_counts_add_up_and_one_bug_found_by_two_shards_is_one_finding():
    same = finding()
    other = finding("happens-before", "unordered-access", "race on 'x'", replay="python -m harness replay --case '{1}'")
    merged = merge_summaries([("a", shard_summary(1, 3, [same])), ("b", shard_summary(2, 3, [same, other]))])
    assert merged["cases"] == 6 and len(merged["cases_log"]) == 6
    assert [f["replay"] for f in merged["findings"]] == [same["replay"], other["replay"]]
    assert merged["shards_missing"] == [3] and merged["shard"] is None


def test_the_race_gates_openings_are_summed_over_the_parts():
    merged = merge_summaries([("a", shard_summary(1, 2, race_gates={"awaited": 2, "deadline": 1})),
                              ("b", shard_summary(2, 2, race_gates={"awaited": 1, "leaked": 1}))])
    assert merged["race_gates"] == {"awaited": 3, "deadline": 1, "leaked": 1}
    assert "race_gates" not in merge_summaries([("a", shard_summary(1, 2)), ("b", shard_summary(2, 2))])


def overlap_tally(publishing: list[float], not_publishing: list[float]) -> dict:
    tally = FastPathOverlap()
    tally.add([BatchOverlap(True, ms) for ms in publishing] + [BatchOverlap(False, ms) for ms in not_publishing])
    return tally.to_dict(timed=True)


def test_the_fast_path_overlap_adds_its_counts_and_takes_the_median_of_the_pooled_values():
    """A median of the shards' medians (0.2 and 0.35) is no median: the merge pools the values (0.3)."""
    unmeasured = {"unmeasured": "no clock"}
    merged = merge_summaries([
        ("a", shard_summary(1, 3, fast_path_overlap=overlap_tally([0.1, 0.2, 0.9], [-0.02]))),
        ("b", shard_summary(2, 3, fast_path_overlap=overlap_tally([0.3, 0.4], []))),
        ("c", shard_summary(3, 3, fast_path_overlap=unmeasured))])  # measured nothing: adds nothing
    assert merged["fast_path_overlap"] == {
        "overlapped_above_ms": 0.05,
        "publishing": {"batches": 5, "measured": 5, "overlapped": 5, "min_ms": 0.1, "median_ms": 0.3, "max_ms": 0.9,
                       "values_ms": [0.1, 0.2, 0.9, 0.3, 0.4]},
        "not_publishing": {"batches": 1, "measured": 1, "overlapped": 0, "min_ms": -0.02, "median_ms": -0.02,
                           "max_ms": -0.02, "values_ms": [-0.02]}}
    check_written(SUMMARY, json.dumps(merged))
    both = [("a", shard_summary(1, 2, fast_path_overlap=unmeasured)), ("b", shard_summary(2, 2, fast_path_overlap=unmeasured))]
    assert merge_summaries(both)["fast_path_overlap"] == unmeasured
    assert "fast_path_overlap" not in merge_summaries([("a", shard_summary(1, 2)), ("b", shard_summary(2, 2))])


def test_the_workers_jobs_reach_the_merged_summary():
    merged = merge_summaries([("a", shard_summary(1, 2, jobs=4)), ("b", shard_summary(2, 2, jobs=4))])
    assert merged["jobs"] == 4


def test_a_folder_that_does_not_belong_is_refused_with_exit_2_naming_it(tmp_path, capsys):
    write_folder(tmp_path / "a", summary_json=shard_summary(1, 2))
    write_folder(tmp_path / "pr", summary_json={**shard_summary(2, 2), "semantics": "pr"})
    write_folder(tmp_path / "corrupt", summary_json='{"target": "reference", "cases": ')
    write_folder(tmp_path / "again", summary_json=shard_summary(1, 2))
    for other, needle in (("pr", "semantics='pr'"), ("corrupt", "summary.json: not valid JSON"),
                          ("again", "shard 1/2 is also in")):
        into = tmp_path / f"into-{other}"
        assert main(["merge", str(tmp_path / "a"), str(tmp_path / other), "--into", str(into)]) == 2
        err = capsys.readouterr().err
        assert needle in err and str(tmp_path / other) in err and "Traceback" not in err
        assert not into.exists()


def test_an_into_folder_that_is_a_source_or_holds_a_report_is_refused_naming_the_flags(tmp_path, capsys):
    """exit 2, naming --into and --overwrite, before anything is written; `merge_folders` itself names its
    parameters (the library never names a flag)."""
    write_folder(tmp_path / "a", summary_json=shard_summary(1, 2))
    write_folder(tmp_path / "b", summary_json=shard_summary(2, 2))
    before = (tmp_path / "a" / "summary.json").read_text()
    assert main(["merge", str(tmp_path / "a"), str(tmp_path / "b"), "--into", str(tmp_path / "a")]) == 2
    assert f"--into {tmp_path / 'a'}: is also one of the folders to merge" in capsys.readouterr().err
    assert main(["merge", str(tmp_path / "b"), "--into", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert f"--into {tmp_path / 'a'}: the folder holds another run's report (summary.json" in err
    assert "pass --overwrite to replace it" in err and (tmp_path / "a" / "summary.json").read_text() == before
    with pytest.raises(InvalidArgument, match=r"^into .*: is also one of the folders to merge$"):
        merge_folders([tmp_path / "a", tmp_path / "b"], tmp_path / "a")
    with pytest.raises(InvalidArgument, match=r"^into .*another run's report.*pass overwrite to replace it$"):
        merge_folders([tmp_path / "b"], tmp_path / "a")


def test_kill_tables_sanitizer_results_and_junit_files_merge(tmp_path):
    names = list(MUTANTS)
    first, second = Shard(1, 2).select(names), Shard(2, 2).select(names)
    junit = ('<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="{n}" failures="0" errors="0" '
             'skipped="0" time="1.0">{cases}</testsuite></testsuites>')
    write_folder(tmp_path / "a", mutants_json=[mutant_row(n) for n in first],
                 sanitizer_json=sanitizer([san_result("racecheck", "attention_t5", "clean")]))
    write_folder(tmp_path / "b", mutants_json=[mutant_row(n) for n in second],
                 sanitizer_json=sanitizer([san_result("memcheck", "attention_t5", "clean")]))
    (tmp_path / "a" / "junit-pytest.xml").write_text(junit.format(n=1, cases='<testcase classname="t" name="a"/>'))
    (tmp_path / "b" / "junit-pytest.xml").write_text(
        junit.format(n=2, cases='<testcase classname="t" name="b"/><testcase classname="t" name="c"/>'))
    clean = {"name": "(clean reference)", "cases": 200, "findings": 0, "finding": None}
    (tmp_path / "a" / "mutants-clean.json").write_text(json.dumps(clean))
    _, verdict, _ = merge_folders([tmp_path / "a", tmp_path / "b"], tmp_path / "merged")
    folder = load_folder(tmp_path / "merged")
    assert sorted(r["name"] for r in folder.mutants) == sorted(names)
    assert folder.clean_reference["cases"] == 200
    assert sorted(r["tool"] for r in folder.sanitizer["results"]) == ["memcheck", "racecheck"]
    assert folder.pytest.tests == 3 and len(folder.pytest.cases) == 3
    assert verdict.status == "CLEAN"
    with pytest.raises(InvalidArgument, match="is also in"):
        merge_folders([tmp_path / "a", tmp_path / "a"], tmp_path / "again")


def test_mutants_shard_runs_its_part_and_leaves_the_clean_reference_to_part_1(tmp_path, capsys):
    count = len(MUTANTS)
    assert main(["mutants", "--examples", "5", "--shard", f"{count}/{count}", "--report-dir", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "mutants.json").read_text())
    assert [r["name"] for r in rows] == [list(MUTANTS)[-1]]
    assert not (tmp_path / "mutants-clean.json").exists()


def test_mutants_list_names_every_mutant(capsys):
    assert main(["mutants", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in lines] == list(MUTANTS)


def sharding_plugin(config) -> list[str]:
    """How the inner run gets the plugin: by its entry point when this run got it so (the project is
    installed), else by name, as this project's conftest.py loads it from a checkout that is not."""
    return [] if config.pluginmanager.has_plugin("dsv4_sharding") else ["-p", "fixtures.sharding"]


def test_the_pytest_shards_partition_the_suite(pytester, request):
    pytester.makepyfile(**{f"test_{i}": "\n".join(f"def test_{j}(): pass" for j in range(4)) for i in range(3)})
    plugin = sharding_plugin(request.config)
    runs = [pytester.runpytest(*plugin, f"--harness-shard={k}/3", "-q") for k in (1, 2, 3)]
    passed = [run.parseoutcomes()["passed"] for run in runs]
    assert passed == [4, 4, 4]
    assert all(run.parseoutcomes()["deselected"] == 8 for run in runs)
    bad = pytester.runpytest(*plugin, "--harness-shard=0/3")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    assert "--harness-shard='0/3': K/N" in bad.stderr.str()
