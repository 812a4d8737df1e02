"""The real-source mutant table (`benchmarks/sglang_source_mutants.py`) against the installed sglang:
every edit still applies to exactly one place, and a few of them (the snapshot step deleted from the real
backend, the scheduler's barrier turned off or moved, a metadata field re-bound, the real forward's chunk cache
rebuilt in every layer) are found by campaigns on the mutated copy.

The edits are checked against the installed release's table (CI: 0.5.23 and 0.5.22); the campaigns use 0.5.23's
rows. Needs sglang and its CPU import deps; skipped without them.
"""

from __future__ import annotations

from harness.sglang_target.api import prepare_triton

prepare_triton()  # before sglang is imported: from 0.5.22 `import sglang` imports triton, which then chooses

import functools  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import shlex  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from importlib.metadata import version  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

pytest.importorskip("sglang", reason="the sglang package is not installed: the source mutants need "
                                     "`pip install --no-deps sglang==0.5.23` plus its CPU import deps")

from harness.case import Batch, Case, Dims, Flags, Mutation, Request  # noqa: E402
from harness.model.enums import ForwardMode, SpeculativeAlgorithm  # noqa: E402
from harness.sglang_target.api import load_api  # noqa: E402
from harness.sglang_target.generations import RELEASED  # noqa: E402
from harness.sglang_target.real_backend import fixed_dims  # noqa: E402

PROJECT = Path(__file__).resolve().parents[1]
SCRIPT = PROJECT / "benchmarks" / "sglang_source_mutants.py"


def load_table():
    if "sglang_source_mutants" not in sys.modules:  # a script, not a package: registered for its dataclass
        spec = importlib.util.spec_from_file_location("sglang_source_mutants", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return sys.modules["sglang_source_mutants"]


@pytest.mark.parametrize("mutant", load_table().installed_table()[1], ids=lambda m: m.name)
def test_each_edit_applies_to_one_place_in_the_installed_source(mutant):
    # the installed release's table: 0.5.23's, 0.5.21 and 0.5.22's (pr-late) or 0.5.19 and 0.5.20's (pr-early)
    source = (load_table().installed_sglang() / mutant.file).read_text()
    for old, new in mutant.edits:
        assert source.count(old) == 1, f"{mutant.name}: {mutant.file} no longer holds the edited text once"
        assert old != new


def test_a_release_whose_campaigns_run_the_draft_extend_graph_off_has_no_row_editing_that_runner():
    """0.5.21 shares 0.5.22's table (`pr-late`), but its campaigns run with EAGLE's draft-extend graph off (its replay
    publishes before the in-graph step reads the mapping): a row editing that runner would never be replayed, and one
    of them is written on 0.5.22's text, absent from 0.5.21's runner."""
    table = load_table()
    editing = {m.name for m in table.TABLES["pr-late"] if m.file == table.DRAFT_GRAPH_RUNNER}
    assert editing and {m.name for m in table.release_table("0.5.22")} >= editing
    assert not {m.name for m in table.release_table("0.5.21")} & editing
    assert len(table.release_table("0.5.21")) == len(table.TABLES["pr-late"]) - len(editing)


# The issue's own example, and one regression of each kind of code the target drives for real: the
# scheduler's barrier (its enabling and its place in the loop), the breakable graph's refresh of its captured
# metadata, and the backend's own forward (issue 27: the chunk cache rebuilt lazily in every layer, after
# read-done).
FOUND_IN_CI = ("snapshot_step_deleted", "barrier_enabled_on_hip_only", "barrier_before_launch",
               "refresh_assigns_c4_out_loc", "prefill_sparse_always_lazy")


def test_regressions_put_back_into_the_real_source_are_found_in_campaigns_on_the_mutated_copy(tmp_path):
    out = tmp_path / "table.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--only", ",".join(FOUND_IN_CI), "--examples", "20",
                           "--out", str(out)], cwd=PROJECT, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = json.loads(out.read_text())
    assert table["clean"]["exit_code"] == 0 and table["clean"]["findings"] == 0
    assert [row["name"] for row in table["rows"]] == list(FOUND_IN_CI)
    for row in table["rows"]:
        assert row["outcome"] == "KILLED", row
        assert row["replay"].startswith(f"python benchmarks/sglang_source_mutants.py --only {row['name']} --replay "
                                        "--target sglang"), row
    assert table["seeds"] and table["rows"][0]["found_on_seed"]  # the first seed case finds the deleted snapshot step
    assert f"    replay: {table['rows'][0]['replay']}\n" in done.stdout  # printed under its row too


def run_command(command: str) -> subprocess.CompletedProcess:
    """A printed command, run as a user pastes it in the project's root (`python` is this interpreter)."""
    argv = shlex.split(command)
    assert argv[0] == "python", command
    return subprocess.run([sys.executable, *argv[1:]], cwd=PROJECT, capture_output=True, text=True, timeout=600)


# A drawn case (DFLASH, one TARGET_VERIFY of 19 tokens over a prefix of 19) on which the verify's compressors
# planned as for a decode step store none of the five c4 blocks the verify completes (BENCHMARKS.md, section 26).
VERIFY_CASE = json.dumps({
    "batches": [{"graph": False, "mode": "TARGET_VERIFY",
                 "mutations": [{"count": 3, "kind": "swa_clear", "poison": False, "target": "other"}],
                 "requests": [{"extend_len": 19, "prefix_len": 19}]}],
    "data_seed": 129, "delay_cycles": 100000000,
    "dims": {"head_dim": 512, "heads": 2, "index_align": 128, "index_dim": 4, "index_topk": 512,
             "kv_format": "fp8_v4", "layer_ratios": [0, 4, 128], "page_size": 256, "swa_window": 4},
    "flags": {"SGLANG_ENABLE_PREFILL_WAR_READ_DONE": True, "SGLANG_FORCE_COARSE_WAR_BARRIER": False,
              "SGLANG_OPT_FLASHMLA_SPARSE_PREFILL": True, "cp_active": False, "hicache_storage": False,
              "hierarchical_cache": False, "hisparse": False, "lmcache": False},
    "graph_contract": "bcg", "semantics": "0.5.23", "spec": "DFLASH"})


def test_a_mutants_replay_command_replays_its_finding_on_the_mutated_copy_and_the_install_stays_clean():
    """A row's `replay` applies the row's edit before the harness's replay: the finding comes back (exit 1); the
    harness's own replay command, against the unmutated install, passes (exit 0)."""
    harness_replay = ("python -m harness replay --target sglang --device cpu --schedule adversarial --case "
                      + shlex.quote(VERIFY_CASE))
    mutated = run_command(load_table().mutant_replay("verify_compressor_plans_decode", harness_replay))
    assert mutated.returncode == 1, mutated.stdout[-3000:] + mutated.stderr[-3000:]
    assert "[float64/attention-mismatch]" in mutated.stdout and "[kv/wrong-kv-slot]" in mutated.stdout
    clean = run_command(harness_replay)
    assert clean.returncode == 0, clean.stdout[-3000:] + clean.stderr[-3000:]


def test_a_mutants_replay_command_keeps_the_server_settings_the_harness_command_sets_first():
    """A campaign of a table run under a server setting (0.5.19 to 0.5.21: the draft-extend graph off) prints replay
    commands that set it first: the row's command keeps it before the script; anything else is no replay command."""
    table = load_table()
    assert table.mutant_replay("m", "SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH=1 python -m harness replay --case '{}'") == (
        "SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH=1 python benchmarks/sglang_source_mutants.py --only m --replay "
        "--case '{}'")
    assert table.server_settings("0.5.19") == {"SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH": "1"}
    assert table.server_settings("0.5.22") == table.server_settings("0.5.23") == {}
    with pytest.raises(ValueError, match="not a harness replay command"):
        table.mutant_replay("m", "rm -rf x; python -m harness replay --case '{}'")


def _draft_extend_padded_after_a_larger_batch() -> str:
    """An EAGLE case (the installed release's semantics and sizes) whose draft extends replay 10 requests, then 9 in
    the same bucket of 10 (SGLang's speculative capture list skips 9), while the scheduler rewrites other requests'
    rows: the replay command of it on the CPU simulator."""
    generation = RELEASED[version("sglang")]
    draft = functools.partial(Batch, mode=ForwardMode.DRAFT_EXTEND, graph=True)
    case = Case(semantics=generation.semantics, spec=SpeculativeAlgorithm.EAGLE, graph_contract="bcg",
                dims=Dims(**fixed_dims(load_api())), flags=Flags(SGLANG_ENABLE_PREFILL_WAR_READ_DONE=True),
                batches=(Batch(requests=(Request(10, 3),)),
                         draft(requests=tuple(Request(2 + i, 3) for i in range(10))),
                         draft(requests=tuple(Request(2 + i, 3) for i in range(9)),
                               mutations=(Mutation("req_to_token_rewrite", target="other", count=2),))))
    return ("python -m harness replay --target sglang --device cpu --schedule adversarial --case "
            + shlex.quote(case.to_json()))


def test_a_padded_draft_extend_bucket_reading_another_requests_row_is_an_undeclared_read():
    """The draft-extend replay declares its live requests' rows and, in a padded bucket, the reserved slot 0 that
    SGLang's `execute` points padded requests at. With that zeroing deleted from the release's runner, the padded
    request keeps the row the larger batch before left in the static buffer, and the plan reads it: an undeclared
    read naming SGLang's kernel, and a stale padded request (`freshness`, read in the static buffers, so found too
    where the stray row is one this batch owns, and on CUDA, where a compiled kernel's reads are not observed). The
    unmutated release replays the same case clean."""
    harness_replay = _draft_extend_padded_after_a_larger_batch()
    mutated = run_command(load_table().mutant_replay("draft_extend_padding_keeps_pool_rows", harness_replay))
    assert mutated.returncode == 1, mutated.stdout[-3000:] + mutated.stderr[-3000:]
    assert ("[happens-before/undeclared-access] undeclared read of 'req_to_token'" in mutated.stdout
            and "init_forward_metadata_out_graph" in mutated.stdout
            and "in build_page_table_positions" in mutated.stdout), mutated.stdout[-3000:]
    assert ("[freshness/stale-padding] batch 2 (DRAFT_EXTEND) replayed the draft-extend graph's batch size 10 with 1 "
            "of its 1 padded requests" in mutated.stdout), mutated.stdout[-3000:]
    clean = run_command(harness_replay)
    assert clean.returncode == 0, clean.stdout[-3000:] + clean.stderr[-3000:]


def test_the_hisparse_gate_deleted_publishes_before_the_per_layer_translations():
    """The row's finding on a constructed case (the table's campaigns find it too, drawing HiSparse cases that
    prefill dense: `KNOWN_BUG_PATHS`): a HiSparse EXTEND batch with dense prefill while the scheduler evicts
    HiSparse entries. With 0.5.23's gate deleted, the resolver declares its reads over before the
    layers translate through full_to_hisparse (the compressor's store, the indexer's translation): a race naming
    SGLang's line. The unmutated release replays it clean."""
    table = load_table()
    if "hisparse_gate_deleted" not in {m.name for m in table.installed_table()[1]}:
        pytest.skip(f"sglang {version('sglang')} has no HiSparse gate (its table has no such row)")
    generation = RELEASED[version("sglang")]
    case = Case(semantics=generation.semantics, graph_contract="bcg", dims=Dims(**fixed_dims(load_api())),
                flags=Flags(SGLANG_ENABLE_PREFILL_WAR_READ_DONE=True, hisparse=True,
                            SGLANG_OPT_FLASHMLA_SPARSE_PREFILL=False),
                batches=(Batch(requests=(Request(40, 300), Request(9, 200)),
                               mutations=(Mutation("hisparse_evict", target="other", count=3),)),))
    harness_replay = ("python -m harness replay --target sglang --device cpu --schedule adversarial --case "
                      + shlex.quote(case.to_json()))
    mutated = run_command(table.mutant_replay("hisparse_gate_deleted", harness_replay))
    assert mutated.returncode == 1, mutated.stdout[-3000:] + mutated.stderr[-3000:]
    assert ("race on 'full_to_hisparse'" in mutated.stdout
            and "in translate_loc_to_hisparse_device" in mutated.stdout), mutated.stdout[-3000:]
    clean = run_command(harness_replay)
    assert clean.returncode == 0, clean.stdout[-3000:] + clean.stderr[-3000:]


def test_replay_takes_one_mutant():
    done = subprocess.run([sys.executable, str(SCRIPT), "--only", "snapshot_step_deleted,barrier_before_launch",
                           "--replay", "--case", "{}"], cwd=PROJECT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--replay: needs exactly one mutant in --only" in done.stderr, done.stderr


def test_no_seeds_reaches_every_campaign_of_the_table(tmp_path):
    out = tmp_path / "table.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--only", "snapshot_step_deleted", "--examples", "10",
                           "--no-seeds", "--out", str(out)], cwd=PROJECT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = json.loads(out.read_text())
    [row] = table["rows"]
    assert not table["seeds"] and row["outcome"] == "KILLED" and row["found_on_seed"] is False, row


def test_a_row_no_run_of_the_release_reaches_is_listed_with_its_reason_and_never_counted_found(tmp_path):
    """DSV4Metadata.copy_ runs only for the decode-side graphs on 0.5.23: its row is named UNREACHABLE with why,
    not run, and not in the found count (a row that never ran is never reported as found)."""
    out = tmp_path / "table.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--only", "copy_keeps_cache", "--no-clean", "--examples", "1",
                           "--out", str(out)], cwd=PROJECT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [row] = json.loads(out.read_text())["rows"]
    assert row["outcome"] == "UNREACHABLE" and "replay_cuda_graph_metadata_from" in row["reason"], row
    assert "0/0 source mutants found (1 unreachable in this release, not run)" in done.stdout
