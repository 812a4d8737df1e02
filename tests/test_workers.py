"""`harness run --workers`: how many, pinned where, and one merged report from their parts."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import build_parser
from harness.commands import run as run_command
from harness.errors import EnvironmentBroken, InvalidArgument
from harness.sharding import Shard
from harness import workers as workers_module
from harness.workers import cpu_cores, plan, worker_count
from reports.folder import load_folder


@pytest.mark.parametrize("flags", [
    [],
    ["--profile", "dev", "--seed", "4", "--examples", "30", "--mutant", "scheduler_no_wait",
     "--oracles", "policy,execution", "--without", "lmcache,hisparse", "--no-shrink", "--no-seeds",
     "--keep-going", "3", "--jobs", "2", "--isolate", "30.5", "--semantics", "pr", "-q"],
    ["--profile", "nightly", "--seed", "1", "--isolate", "off", "--example-db", "redis://host:6379", "-v"],
])
def test_a_worker_gets_the_campaign_config_of_its_run(tmp_path, flags):
    """The worker's flags are the run's config turned back into flags: parsed in the worker, the same
    config (but for the worker's own report folder), the output as verbose as the run's."""
    parser = build_parser()
    args = parser.parse_args(["run", "--device", "cpu", "--report-dir", str(tmp_path / "r"), *flags])
    config = run_command.campaign_config(args, "cpu", Path(args.report_dir), processes=1)
    argv = run_command.worker_argv(config, args, list(config.shared_databases))
    worker = parser.parse_args(["run", *argv, "--report-dir", str(tmp_path / "w1")])
    assert run_command.campaign_config(worker, "cpu", Path(worker.report_dir), processes=1) == \
        dataclasses.replace(config, database_dir=tmp_path / "w1" / "examples")
    assert (worker.quiet, worker.verbose, worker.progress_every) == (args.quiet, args.verbose, args.progress_every)


def test_auto_is_one_worker_per_visible_gpu_on_cuda_and_per_core_on_the_cpu():
    assert worker_count("auto", "cuda", ["0", "1", "3"]) == 3
    assert worker_count("auto", "cpu") == cpu_cores()
    assert worker_count("2", "cuda", ["0", "1", "3"]) == 2


@pytest.mark.parametrize("spec, device, gpus, error, needle", [
    ("4", "cuda", ["0", "1"], InvalidArgument,
     "2 GPU(s) visible (0,1), one per worker; use --workers 2 or auto, or --gpu-share"),
    ("auto", "cuda", [], EnvironmentBroken, "no GPU is visible"),
    ("two", "cpu", None, InvalidArgument, "--workers='two': auto or a number of workers > 0"),
    ("0", "cpu", None, InvalidArgument, "--workers='0'"),
    ("9", "cpu", None, InvalidArgument, "--workers=9: more workers than the 8 core(s) this process may run on"),
    ("9", "cuda", ["0"] * 9, InvalidArgument, "more workers than the 8 core(s)"),
])
def test_bad_worker_counts_are_refused(spec, device, gpus, error, needle, monkeypatch):
    monkeypatch.setattr(workers_module, "cpu_cores", lambda: 8)
    with pytest.raises(error, match=needle.replace("(", r"\(").replace(")", r"\)")):
        worker_count(spec, device, gpus, name="--workers", share_name="--gpu-share")


def test_workers_share_gpus_round_robin_only_when_asked(tmp_path, monkeypatch):
    monkeypatch.setattr(workers_module, "cpu_cores", lambda: 16)
    assert worker_count("5", "cuda", ["0", "1"], share=True) == 5
    assert worker_count("auto", "cuda", ["0"], share=True) == 8  # one per two cores: a worker and its child
    assert worker_count("auto", "cuda", ["0", "1"]) == 2
    monkeypatch.setattr(workers_module, "cpu_cores", lambda: 2)
    assert worker_count("auto", "cuda", ["0", "1", "2"], share=True) == 3  # never fewer than one per GPU
    workers = plan(5, Shard(1, 1), tmp_path, ["0", "1"])
    assert [w.cuda_visible_devices for w in workers] == ["0", "1", "0", "1", "0"]


@pytest.mark.parametrize("extra", [["--device", "cpu", "--workers", "2"], ["--device", "cpu"]],
                         ids=["on-the-cpu", "one-process"])
def test_gpu_share_without_cuda_workers_is_refused_before_any_work(tmp_path, extra):
    done = subprocess.run([sys.executable, "-m", "harness", "run", "--gpu-share", *extra, "--report-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--gpu-share: workers share GPUs only with --device cuda and --workers N|auto" in done.stderr
    assert "Traceback" not in done.stderr and not any(tmp_path.iterdir())


def test_the_default_of_one_process_needs_no_gpu_listing(monkeypatch):
    """`run --device cuda` without --workers once listed the GPUs and, given none, refused to run at all."""
    def no_listing():
        raise AssertionError("the default --workers 1 asked NVML for the GPUs")

    monkeypatch.setattr(run_command, "visible_gpus", no_listing)
    assert run_command.worker_plan("1", "cuda") == (False, None, 1)
    monkeypatch.setattr(run_command, "visible_gpus", lambda: ["0"])
    assert run_command.worker_plan("auto", "cuda") == (True, ["0"], 1)


def test_each_worker_is_pinned_to_its_own_gpu_and_its_own_part_of_the_shard(tmp_path):
    workers = plan(3, Shard(2, 2), tmp_path, ["0", "1", "GPU-abc"])
    assert [w.cuda_visible_devices for w in workers] == ["0", "1", "GPU-abc"]
    assert [str(w.shard) for w in workers] == ["2/6", "4/6", "6/6"]
    positions = sorted(p for w in workers for p in w.shard.select(range(30)))
    assert positions == Shard(2, 2).select(range(30))
    assert plan(2, Shard(1, 1), tmp_path, None)[0].cuda_visible_devices is None


def test_two_cpu_workers_write_one_merged_report(tmp_path):
    done = subprocess.run([sys.executable, "-m", "harness", "run", "--device", "cpu", "--examples", "12", "-q",
                           "--workers", "2", "--report-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = load_folder(tmp_path).summary
    assert summary["cases"] == 12 and [w["shard"] for w in summary["workers"]] == ["1/2", "2/2"]
    assert sum(w["cases"] for w in summary["workers"]) == 12
    assert all(w["cases_per_second"] for w in summary["workers"])
    assert "workers/w1: shard 1/2" in done.stdout
    assert (tmp_path / "index.html").is_file() and "Workers and shards (2)" in (tmp_path / "index.html").read_text()
    assert (tmp_path / "workers" / "w2" / "summary.json").is_file()


@pytest.mark.gpu
def test_workers_auto_on_cuda_runs_one_worker_per_visible_gpu(tmp_path):
    from harness.workers import visible_gpus

    gpus = visible_gpus()
    done = subprocess.run([sys.executable, "-m", "harness", "run", "--device", "cuda", "--examples", str(4 * len(gpus)),
                           "-q", "--workers", "auto", "--report-dir", str(tmp_path)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [w["cuda_visible_devices"] for w in summary["workers"]] == gpus
    assert all(w["gpu"] for w in summary["workers"]), "each worker's telemetry names its GPU"


@pytest.mark.gpu
def test_workers_sharing_gpus_are_dealt_round_robin_and_merged(tmp_path):
    from harness.workers import visible_gpus

    gpus = visible_gpus()
    count = 2 * len(gpus)
    done = subprocess.run([sys.executable, "-m", "harness", "run", "--device", "cuda", "--examples", str(3 * count),
                           "--seed", "1", "-q", "--workers", str(count), "--gpu-share", "--report-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [w["cuda_visible_devices"] for w in summary["workers"]] == gpus * 2
    assert summary["cases"] == sum(w["cases"] for w in summary["workers"]) > 0
