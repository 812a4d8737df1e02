"""`python -m harness run`: the fuzz campaign, in this process or in worker processes, into one report folder."""

from __future__ import annotations

import os
import random
import shutil
import sys
from pathlib import Path
from typing import Optional

from harness.campaign import check_jobs, keeps_database, run_campaign
from harness.choices import AUTO_JOBS_MAX, PROFILES
from harness.commands.options import parse_without
from harness.coverage import describe as describe_coverage
from harness.device import resolve_device
from harness.errors import EnvironmentBroken, ExitCode, InvalidArgument
from harness.example_db import check_shared
from harness.interrupts import stop_on_signals
from harness.oracles import oracle_names, parse_oracles
from harness.progress import NORMAL, QUIET, VERBOSE, CampaignProgress
from harness.sharding import Shard
from harness.targets import load_target
from harness.telemetry import TelemetryWindow, annotate_summary
from harness.workers import WORKERS_DIR, WorkerProcesses, announce_ready, visible_gpus, worker_count
from harness.workers import plan as plan_workers
from reports import junit
from reports.cli import render_folder
from reports.folder import load_folder, time_rows
from reports.merge import merge_summaries
from reports.schema import REPLAY_SUMMARY, SUMMARY
from reports.writers import new_staging_folder, refuse_other_runs, replace_report, write_report


def run(args) -> int:
    semantics = args.semantics
    shard = Shard.parse(args.shard)
    if shard.count > 1 and args.seed is None and not PROFILES[args.profile]["derandomize"]:
        raise InvalidArgument(f"--shard={args.shard} with the {args.profile!r} profile needs --seed S, the same on "
                              "every shard, so that the shards are parts of one case stream")
    shared = [check_shared(spec) for spec in args.example_db]
    if (shared or args.from_db) and not keeps_database(args.profile, args.seed):
        flag = "--from-db" if args.from_db else "--example-db"
        raise InvalidArgument(f"{flag}: the {args.profile!r} profile is derandomized and keeps no example database "
                              "(dev and nightly do, and so does any profile with --seed)")
    if args.gpu_share and args.workers == "1":
        raise InvalidArgument("--gpu-share: workers share GPUs only with --device cuda and --workers N|auto "
                              "(here --workers 1)")
    device = resolve_device(args.device)
    if args.gpu_share and device != "cuda":
        raise InvalidArgument(f"--gpu-share: workers share GPUs only with --device cuda and --workers N|auto "
                              f"(here --device {device})")
    jobs = _jobs(args.jobs)
    isolate_s = _isolate(args.isolate, device, jobs=jobs or 1)
    check_jobs(jobs or 1, isolate_s)
    oracles = parse_oracles(args.oracles)
    without = parse_without(args.without)
    report_dir = Path(args.report_dir)
    if not args.from_db:  # a replay writes replay-summary.json beside the campaign it replays
        refuse_other_runs(report_dir, (SUMMARY,), overwrite=args.overwrite)
    target = load_target(args.target, mutant=args.mutant)
    in_workers, gpus, count = worker_plan(args.workers, device, share=args.gpu_share)
    args.jobs = jobs or auto_jobs(device, isolate_s, processes=count)  # the workers get the number
    if in_workers and args.from_db:
        raise InvalidArgument(f"--workers={args.workers} with --from-db: a replay of the database runs in one process")
    verbosity = QUIET if args.quiet else VERBOSE if args.verbose else NORMAL
    with stop_on_signals() as stop:  # from here a signal never interrupts a write: the report is kept
        announce_ready()
        if in_workers:
            summary = _run_workers(args, device=device, semantics=semantics, shard=shard, count=count, gpus=gpus,
                                   shared=shared, report_dir=report_dir, stop=stop)
        else:
            summary = _run_one(args, target=target, device=device, semantics=semantics, shard=shard, shared=shared,
                               isolate_s=isolate_s, oracles=oracles, without=without, verbosity=verbosity,
                               report_dir=report_dir, stop=stop)
        return _print_result(args, summary, device=device, semantics=semantics, target=target, shard=shard,
                             report_dir=report_dir)


def _print_result(args, summary: dict, *, device, semantics, target, shard, report_dir) -> int:
    """What the campaign found, on stdout, and the exit code: found, else interrupted, else clean. The
    count is of failures (a failing case, with its replay command), as the progress line's."""
    failures: dict[str, list[dict]] = {}  # replay command -> that failing case's findings, in order
    for finding in summary["findings"]:
        failures.setdefault(finding["replay"], []).append(finding)
    print(f"{summary['cases']} cases on {device} ({semantics}, target {target.name}"
          f"{', shard ' + args.shard if shard.count > 1 else ''}"
          f"{f', {args.jobs} judged at once' if args.jobs > 1 else ''}) in {summary['duration_s']:.1f}s"
          f" ({summary['cases_per_second']} cases/s): {len(failures)} failure(s), {len(summary['findings'])} "
          "finding(s)")
    for row in summary.get("workers") or []:
        gpu = row.get("gpu") or row.get("cuda_visible_devices") or "-"
        print(f"  {row['folder']}: shard {row['shard']}, GPU {gpu}, "
              f"{row['cases']} cases, {row['cases_per_second']} cases/s")
    if summary.get("time") and not args.quiet:
        print(f"  time: {time_shares(summary['time'])}")
    gates = summary.get("race_gates") or {}
    if gates and not args.quiet:
        print(f"  race gates: {gate_counts(gates)}")
    for warning in gate_warnings(gates):
        print(f"  warning: {warning}", file=sys.stderr)
    if summary.get("coverage") and not args.quiet:
        print(f"  coverage: {describe_coverage(summary['coverage'])}")
    for replay, findings in failures.items():
        for finding in findings:
            print(f"  [{finding['oracle']}/{finding['kind']}] {finding['message']}")
        label = "minimal case" if summary.get("shrunk") else "case (not shrunk)"
        print(f"  {label}: {findings[0]['case_summary']}")
        print(f"  replay: {replay}")
    if failures:
        if summary["first_detection"]:
            print(f"  found after {summary['first_detection']['examples']} example(s), "
                  f"{summary['first_detection']['seconds']:.2f}s")
        if summary.get("shrunk") and summary.get("shrink_seconds") is not None:
            print(f"  shrunk in {summary['shrink_seconds']:.2f}s"
                  f"{', starting from the seed case it was found on' if summary.get('found_on_seed') else ''}")
    if summary["interrupted"]:
        print(f"interrupted by {summary['interrupted']} after {summary['cases']} cases: the report holds them")
    print(f"summary: {report_dir / (REPLAY_SUMMARY if args.from_db else SUMMARY)}")
    print(f"page: {report_dir / 'index.html'}")
    if summary["findings"]:
        return ExitCode.FOUND
    return ExitCode.INTERRUPTED if summary["interrupted"] else ExitCode.OK


def _run_one(args, *, target, device, semantics, shard, shared, isolate_s, oracles, without, verbosity,
             report_dir, stop) -> dict:
    """One campaign in this process; its summary and page replace the folder's in one step."""
    total = args.examples or PROFILES[args.profile]["max_examples"]
    with TelemetryWindow(required=device == "cuda") as window, \
            CampaignProgress(len(range(shard.index - 1, total, shard.count)), verbosity=verbosity,
                             every_s=args.progress_every) as progress:
        result = run_campaign(target, target_spec=args.target, device=device, semantics=semantics,
                              examples=args.examples, seed=args.seed, profile=args.profile,
                              database_dir=report_dir / "examples", mutant=args.mutant, on_case=progress.update,
                              shrink=not args.no_shrink, oracles=oracles, from_db=args.from_db, isolate_s=isolate_s,
                              seeds=not args.no_seeds, keep_going=args.keep_going,
                              shard=shard, shared_databases=shared, should_stop=stop, jobs=args.jobs,
                              without=without)
    summary = annotate_summary(result.summary(), window)
    summary["mutant"] = args.mutant
    summary["oracles"] = [name for name in oracle_names() if oracles is None or name in oracles]  # as they judged
    summary["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES") if device == "cuda" else None
    stop.writing()
    name = REPLAY_SUMMARY if args.from_db else SUMMARY  # a replay keeps the nightly's own
    _publish(report_dir, name, summary, keeps_workers=args.from_db)
    return summary


def gate_counts(gates: dict[str, int]) -> str:
    """How a campaign's CUDA race gates opened (`harness.device.gates`), as one line."""
    return ", ".join(f"{count} {way}" for way, count in sorted(gates.items()))


def gate_warnings(gates: dict[str, int]) -> list[str]:
    """What a user must hear about the gates: a gate the GPU ran past while it was closed. (A gate
    opened at its deadline is counted, not warned about: the host took longer to issue the batch
    than the case's window, which the old fixed sleep could not widen either.)"""
    if not gates.get("leaked"):
        return []
    return [f"{gates['leaked']} race gate(s) leaked: the GPU ran the held stream past a closed gate, so those windows "
            "were not held"]


def time_shares(spent: dict[str, float]) -> str:
    """`summary.json`'s `time`, as shares of its total, largest first: "oracles 31%, world 12%, ..."."""
    return ", ".join(f"{phase} {share:.0%}" for phase, _, share in time_rows(spent) if share >= 0.005)


def worker_plan(spec: str, device: str, *, share: bool = False) -> tuple[bool, Optional[list[str]], int]:
    """Whether the campaign runs in worker processes, the GPUs they are pinned to, and how many. Any
    `--workers` but the default 1 is asked for: even one worker runs apart, pinned, and is listed in the
    report. The default runs in this process and needs no GPU listing (NVML) at all."""
    if spec == "1":
        return False, None, 1
    gpus = visible_gpus() if device == "cuda" else None
    return True, gpus, worker_count(spec, device, gpus, share=share)


def _run_workers(args, *, device, semantics, shard, count, gpus, shared, report_dir, stop) -> dict:
    """`count` worker processes on the parts of `shard`, then one merged summary and page. A random
    profile without --seed gets one seed drawn here, so that the workers share one case stream (the
    summary records it, so the run can be repeated)."""
    if args.seed is None and not PROFILES[args.profile]["derandomize"]:
        args.seed = random.getrandbits(32)
    staging = new_staging_folder(report_dir)
    try:
        workers = plan_workers(count, shard, staging, gpus)
        databases = shared + ([str(report_dir / "examples")] if keeps_database(args.profile, args.seed) else [])
        run_args = ["--target", args.target, "--device", device, "--profile", args.profile, "--semantics", semantics,
                    "--isolate", args.isolate, "--progress-every", str(args.progress_every), "--workers", "1"]
        for flag, value in (("--mutant", args.mutant), ("--oracles", args.oracles), ("--examples", args.examples),
                            ("--seed", args.seed), ("--without", args.without or None)):
            if value is not None:
                run_args += [flag, str(value)]
        run_args += [arg for db in databases for arg in ("--example-db", db)]
        run_args += (["--no-shrink"] if args.no_shrink else []) + (["--no-seeds"] if args.no_seeds else [])
        run_args += ["--keep-going", str(args.keep_going), "--jobs", str(args.jobs)]
        run_args += (["-q"] if args.quiet else []) + (
            ["-v"] if args.verbose else [])
        processes = WorkerProcesses(workers, run_args)
        stop.forward_to(processes.signal)
        for worker in workers:
            print(f"worker {worker.name}: shard {worker.shard} of the stream"
                  f"{', CUDA_VISIBLE_DEVICES=' + worker.cuda_visible_devices if worker.cuda_visible_devices else ''}",
                  file=sys.stderr)
        processes.start()  # a signal before this is held by `processes` for each worker until it is ready
        codes, wall_s = processes.wait()
        stop.writing()
        sources = []
        for worker, code in zip(workers, codes, strict=True):
            if code not in (ExitCode.OK, ExitCode.FOUND, ExitCode.INTERRUPTED) or not (worker.folder / SUMMARY).is_file():
                log = (worker.folder / "output.log").read_text(errors="replace").strip()[-1500:]
                raise EnvironmentBroken(f"worker {worker.name} (shard {worker.shard}) exited {code} without a "
                                        f"campaign summary; its output ends:\n{log or '(nothing)'}")
            sources.append((f"{WORKERS_DIR}/{worker.name}", load_folder(worker.folder).summary))
        summary = merge_summaries(sources, duration_s=wall_s, whole=shard.to_dict())
        summary["interrupted"] = summary["interrupted"] or stop.signal_name
        _publish(report_dir, SUMMARY, summary, staging=staging)
        return summary
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _publish(report_dir: Path, name: str, summary: dict, *, staging: Optional[Path] = None,
             keeps_workers: bool = False) -> None:
    """The summary, its JUnit and the page replace the folder's in one step (`replace_report`); the
    previous run's workers' folders go too, unless this is a replay beside that run."""
    def build(folder: Path) -> None:
        write_report(folder / name, summary)
        render_folder(folder, shown_as=report_dir)

    replaced = (name, junit.CAMPAIGN, "index.html") + (() if keeps_workers else (WORKERS_DIR,))
    replace_report(report_dir, replaced, build, staging=staging)


def _jobs(value: str) -> Optional[int]:
    """--jobs: the number asked for, or None for auto."""
    if value == "auto":
        return None
    if not value.isdigit() or int(value) < 1:
        raise InvalidArgument(f"--jobs={value!r}: a number of cases judged at once >= 1, or auto")
    return int(value)


def auto_jobs(device: str, isolate_s: Optional[float], *, processes: int) -> int:
    """--jobs auto: on CUDA with isolation, one job per two of the cores each of the run's `processes`
    (workers) has, at most AUTO_JOBS_MAX: a case keeps its child's core busy and the GPU mostly idle,
    and on an H200 with 16 cores 6, 8 and 12 jobs judged the same cases per second. On the CPU the
    forwards themselves are the work, so one case at a time, in this process."""
    if device != "cuda" or not isolate_s:
        return 1
    return max(1, min(AUTO_JOBS_MAX, len(os.sched_getaffinity(0)) // (2 * processes)))


def _isolate(value: str, device: str, *, jobs: int):
    if value == "auto":
        return 120.0 if device == "cuda" or jobs > 1 else None
    if value == "off":
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if seconds <= 0:
        raise InvalidArgument(f"--isolate={value!r}: a timeout in seconds > 0, off, or auto")
    return seconds
