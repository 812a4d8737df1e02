"""`python -m harness run`: the fuzz campaign, in this process or in worker processes, into one report folder."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Optional

from harness.campaign import Campaign, CampaignConfig, keeps_database
from harness.choices import AUTO_JOBS_MAX, PROFILES
from harness.commands.options import check_target_semantics, parse_without, target_spec_of
from harness.coverage import describe as describe_coverage
from harness.device import DeviceKind, resolve_device
from harness.errors import EnvironmentBroken, ExitCode, InvalidArgument
from harness.example_db import check_shared
from harness.interrupts import stop_on_signals
from harness.overlap import describe as describe_overlap
from harness.oracles import oracle_names, parse_oracles
from harness.progress import NORMAL, QUIET, VERBOSE, CampaignProgress
from harness.sharding import Shard
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
    device = resolve_device(args.device, option="--device")
    check_run_flags(args, device)
    report_dir = Path(args.report_dir)
    if not args.from_db:  # a replay writes replay-summary.json beside the campaign it replays
        refuse_other_runs(report_dir, (SUMMARY,), overwrite=args.overwrite, name="--report-dir",
                          overwrite_name="--overwrite")
    in_workers, gpus, count = worker_plan(args.workers, device, share=args.gpu_share)
    config = campaign_config(args, device, report_dir, processes=count)
    target = config.target_spec.load()
    check_target_semantics(target, config.semantics)
    if in_workers and args.from_db:
        raise InvalidArgument(f"--workers={args.workers} with --from-db: a replay of the database runs in one process")
    with stop_on_signals() as stop:  # from here a signal never interrupts a write: the report is kept
        announce_ready()
        if in_workers:
            summary = _run_workers(args, config.with_fixed_stream(), count=count, gpus=gpus, report_dir=report_dir,
                                   stop=stop)
        else:
            summary = _run_one(args, target, config, report_dir=report_dir, stop=stop)
        return _print_result(args, summary, config=config, target=target, report_dir=report_dir)


def check_run_flags(args, device: str) -> None:
    """The checks of flags that are wrong only together, naming the flags, before any work (each flag's
    own value is checked as it is parsed, `harness.commands.parsers`)."""
    shard = Shard.parse(args.shard, "--shard")
    if shard.count > 1 and args.seed is None and not PROFILES[args.profile]["derandomize"]:
        raise InvalidArgument(f"--shard={args.shard} with the {args.profile!r} profile needs --seed S, the same on "
                              "every shard, so that the shards are parts of one case stream")
    for spec in args.example_db:
        check_shared(spec, name="--example-db")
    if (args.example_db or args.from_db) and not keeps_database(args.profile, args.seed):
        flag = "--from-db" if args.from_db else "--example-db"
        raise InvalidArgument(f"{flag}: the {args.profile!r} profile is derandomized and keeps no example database "
                              "(dev and nightly do, and so does any profile with --seed)")
    if args.gpu_share and args.workers == "1":
        raise InvalidArgument("--gpu-share: workers share GPUs only with --device cuda and --workers N|auto "
                              "(here --workers 1)")
    if args.gpu_share and not DeviceKind(device).uses_gpus:
        raise InvalidArgument(f"--gpu-share: workers share GPUs only with --device cuda and --workers N|auto "
                              f"(here --device {device})")
    if (args.jobs or 1) > 1 and not isolate_seconds(args.isolate, device, jobs=args.jobs):
        raise InvalidArgument(f"--jobs={args.jobs}: cases judged at once are each judged in a child process; "
                              "--isolate off leaves none (give --isolate SECONDS or auto)")


def campaign_config(args, device: str, report_dir: Path, *, processes: int) -> CampaignConfig:
    """The campaign the flags ask for, `--jobs auto` and `--isolate auto` resolved for this device and
    the run's `processes` (workers)."""
    isolate_s = isolate_seconds(args.isolate, device, jobs=args.jobs or 1)
    return CampaignConfig(
        target_spec=target_spec_of(args), device=device, semantics=args.semantics, examples=args.examples,
        seed=args.seed, profile=args.profile, database_dir=report_dir / "examples", shrink=not args.no_shrink,
        oracles=parse_oracles(args.oracles, "--oracles"), from_db=args.from_db, isolate_s=isolate_s, seeds=not args.no_seeds,
        shard=Shard.parse(args.shard, "--shard"), shared_databases=tuple(args.example_db), keep_going=args.keep_going,
        jobs=args.jobs or auto_jobs(device, isolate_s, processes=processes), without=parse_without(args.without))


def worker_argv(config: CampaignConfig, args, databases: list[str]) -> list[str]:
    """`harness run`'s options that make a worker's campaign `config` (the worker's shard and report
    folder are added to them), its output as verbose as this run's; `databases`: its --example-db.
    tests/test_workers.py parses them back into the same config."""
    values = {"--device": config.device, "--profile": config.profile,
              "--semantics": config.semantics, "--isolate": "off" if config.isolate_s is None else config.isolate_s,
              "--progress-every": args.progress_every, "--workers": 1,
              "--oracles": None if config.oracles is None else ",".join(sorted(config.oracles)),
              "--examples": config.examples, "--seed": config.seed, "--without": ",".join(sorted(config.without)),
              "--keep-going": config.keep_going, "--jobs": config.jobs}
    switches = {"--no-shrink": not config.shrink, "--no-seeds": not config.seeds, "-q": args.quiet,
                "-v": args.verbose}
    argv = config.target_spec.arguments()
    argv += [arg for flag, value in values.items() if value not in (None, "") for arg in (flag, str(value))]
    argv += [arg for db in databases for arg in ("--example-db", db)]
    return argv + [flag for flag, on in switches.items() if on]


def _print_result(args, summary: dict, *, config: CampaignConfig, target, report_dir) -> int:
    """What the campaign found, on stdout, and the exit code: found, else interrupted, else clean. The
    count is of failures (a failing case, with its replay command), as the progress line's."""
    failures: dict[str, list[dict]] = {}  # replay command -> that failing case's findings, in order
    for finding in summary["findings"]:
        failures.setdefault(finding["replay"], []).append(finding)
    print(f"{summary['cases']} cases on {config.device} ({config.semantics}, target {target.name}"
          f"{', shard ' + args.shard if config.shard.count > 1 else ''}"
          f"{f', {config.jobs} judged at once' if config.jobs > 1 else ''}) in {summary['duration_s']:.1f}s"
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
    overlap = summary.get("fast_path_overlap")
    if overlap and config.device.real_concurrency and not args.quiet:
        print(f"  fast path: {describe_overlap(overlap)}")
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


def _run_one(args, target, config: CampaignConfig, *, report_dir: Path, stop) -> dict:
    """One campaign in this process; its summary and page replace the folder's in one step."""
    verbosity = QUIET if args.quiet else VERBOSE if args.verbose else NORMAL
    shard = config.shard
    with TelemetryWindow(required=config.device.uses_gpus) as window, \
            CampaignProgress(len(range(shard.index - 1, config.max_examples, shard.count)), verbosity=verbosity,
                             every_s=args.progress_every) as progress:
        result = Campaign(target, config, on_case=progress.update, should_stop=stop).run()
    summary = annotate_summary(result.summary(), window)
    summary["mutant"] = config.target_spec.mutant
    summary["oracles"] = [name for name in oracle_names()
                          if config.oracles is None or name in config.oracles]  # as they judged
    summary["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES") if config.device.uses_gpus else None
    stop.writing()
    name = REPLAY_SUMMARY if config.from_db else SUMMARY  # a replay keeps the nightly's own
    _publish(report_dir, name, summary, keeps_workers=config.from_db)
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
    gpus = visible_gpus() if DeviceKind(device).uses_gpus else None
    return True, gpus, worker_count(spec, device, gpus, share=share, name="--workers", share_name="--gpu-share")


def _run_workers(args, config: CampaignConfig, *, count, gpus, report_dir, stop) -> dict:
    """`count` worker processes on the parts of the config's shard, then one merged summary and page. The
    config's stream is fixed (`CampaignConfig.with_fixed_stream`), so that the workers share one case
    stream (the summary records its seed, so the run can be repeated)."""
    staging = new_staging_folder(report_dir)
    try:
        workers = plan_workers(count, config.shard, staging, gpus)
        databases = list(config.shared_databases) + ([] if config.derandomized else [str(report_dir / "examples")])
        run_args = worker_argv(config, args, databases)
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
        summary = merge_summaries(sources, duration_s=wall_s, whole=config.shard.to_dict())
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


def auto_jobs(device: str, isolate_s: Optional[float], *, processes: int) -> int:
    """--jobs auto: on CUDA with isolation, one job per two of the cores each of the run's `processes`
    (workers) has, at most AUTO_JOBS_MAX: a case keeps its child's core busy and the GPU mostly idle,
    and on an H200 with 16 cores 6, 8 and 12 jobs judged the same cases per second. On the CPU the
    forwards themselves are the work, so one case at a time, in this process."""
    if not DeviceKind(device).isolates_runs or not isolate_s:
        return 1
    return max(1, min(AUTO_JOBS_MAX, len(os.sched_getaffinity(0)) // (2 * processes)))


def isolate_seconds(value, device: str, *, jobs: Optional[int]) -> Optional[float]:
    """--isolate's timeout (`validation.isolate_option`: seconds, None for off, or auto): auto is 120 s on
    CUDA or with more than one job (`jobs` None: --jobs auto, which is more than one only where auto
    isolates), else none."""
    if value == "auto":
        return 120.0 if DeviceKind(device).isolates_runs or (jobs or 1) > 1 else None
    return value
