"""`python -m harness nightly`: the nightly GPU job as one command, into one report folder.

The steps run one after another, each in its own process (a step that kills its CUDA context does
not take the others down): the `cases/` suite against the target under test (`--target`, or
`[tool.dsv4-harness] target`), its xdist workers one per core and sharing the GPUs (the harness's
own tests, `tests/`, only with `--self-tests`: they check the harness, not the user's SGLang, and
they are its CI's job), the fuzz campaign in the `nightly` profile against the same target (its
example database kept in the folder), the mutant kill table, the sanitizer run, then the page.
On `--device cuda` without a visible GPU the nightly is refused before any step (exit 3). `nightly.json` records every step's command, exit code and time. On SIGINT or
SIGTERM the step in flight gets the signal (it stops and writes what it has), no later step starts,
and nightly.json and the page are still written (exit 4 unless something was found or broke). The exit code
is the worst of the steps: 3 when any step could not run or could not vouch, else 1 when anything
was found, else 0. A step is skipped only when asked (`--skip`), and the page says so.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.device import DeviceKind
from harness.errors import ExitCode
from harness.interrupts import StopRequest, stop_on_signals
from harness.progress import PROGRESS_EVERY_S
from harness.sharding import WHOLE, Shard
from harness.workers import cpu_cores
from reports.schema import NIGHTLY
from reports.writers import write_report

# pytest's own exit codes (`pytest.ExitCode`): 2 is its interruption, 3 its internal error, 4 a usage
# error and 5 "no tests collected", the last three a step that could not run
PYTEST_OUTCOMES = {0: "clean", 1: "found", 2: "interrupted"}
HARNESS_OUTCOMES = {ExitCode.OK: "clean", ExitCode.FOUND: "found", ExitCode.INTERRUPTED: "interrupted"}


@dataclass
class Step:
    name: str
    command: list[str]
    exit_code: int | None = None
    seconds: float = 0.0
    outcome: str = "skipped"  # clean | found | broken | skipped | interrupted


def plan(report_dir: Path, *, device: str, examples: int | None, workers: int | None, semantics: str,
         skip: frozenset[str], shard: Shard = WHOLE, overwrite: bool = False,
         progress_every: float = PROGRESS_EVERY_S, seed: int | None = None,
         example_dbs: tuple[str, ...] = (), target: str = "reference", self_tests: bool = False) -> list[Step]:
    """`workers`: the campaign's (None, auto: one per GPU) and pytest's xdist workers (None: one per
    core, sharing the GPUs on cuda: a case is mostly host work, and one worker per GPU left 15 of an
    H200 host's 16 cores idle). `target`: what the cases and the campaign judge. `self_tests`: the
    harness's own tests too. `shard`: this host's part of the suite, the case stream and the mutants
    (`harness.commands.nightly` leaves the sanitizer out of every part but the first)."""
    python = sys.executable
    folder = str(report_dir)
    replace = ["--overwrite"] if overwrite else []
    parts = ["--shard", str(shard)] if shard.count > 1 else []
    campaign = [python, "-m", "harness", "run", "--target", target, "--device", device, "--profile", "nightly",
                "--semantics", semantics,
                "--report-dir", folder, "--workers", "auto" if workers is None else str(workers),
                "--progress-every", str(progress_every),
                *parts, *replace] + (["--examples", str(examples)] if examples else []) + (
                   ["--seed", str(seed)] if seed is not None else []) + [
                   arg for db in example_dbs for arg in ("--example-db", db)]
    steps = [
        # `--option=value`: before the plugins load, pytest reads a separate value as a test path
        # and takes the report folder for the rootdir, missing the project's conftest and tests
        Step("pytest", [python, "-m", "pytest", *pytest_workers(workers, device), f"--harness-device={device}",
                        f"--harness-target={target}", f"--harness-report={folder}", "-q"]
             + ([f"--harness-shard={shard}"] if parts else []) + ["cases"] + (["tests"] if self_tests else [])),
        Step("campaign", campaign),
        Step("mutants", [python, "-m", "harness", "mutants", "--device", device, "--semantics", semantics,
                         "--report-dir", folder, *parts, *replace]),
        Step("sanitize", [python, "-m", "harness", "sanitize", "--tool", "all", "--jobs", "4", "--report-dir", folder]),
    ]
    return [s if s.name not in skip else Step(s.name, s.command, outcome="skipped") for s in steps]


def pytest_workers(workers: int | None, device: str) -> list[str]:
    """The pytest step's xdist options: None (auto) is one worker per core (on cuda sharing the GPUs, as
    `--gpu-share` allows); a number is that many, sharing the GPUs on cuda too."""
    count = cpu_cores() if workers is None else workers
    return ["-n", str(count)] + (["--gpu-share"] if DeviceKind(device).uses_gpus else [])


def run_steps(steps: list[Step], skip: frozenset[str], log=print, stop: StopRequest | None = None) -> int:
    """Each step in a process group of its own, so that a signal reaches it only through `stop`, which
    passes it on: the step in flight stops and writes what it has, no later step starts."""
    for step in steps:
        if step.name in skip:
            log(f"[{step.name}] skipped (--skip)")
            continue
        if stop is not None and stop.requested:
            log(f"[{step.name}] not started: {stop.signal_name}")
            step.outcome = "interrupted"
            continue
        log(f"[{step.name}] {' '.join(step.command)}")
        began = time.perf_counter()
        proc = subprocess.Popen(step.command, start_new_session=True)
        if stop is not None:
            stop.forward_to(lambda signum, step_process=proc: step_process.poll() is None
                            and step_process.send_signal(signum))
        step.exit_code = proc.wait()
        step.seconds = round(time.perf_counter() - began, 1)
        outcomes = PYTEST_OUTCOMES if step.name == "pytest" else HARNESS_OUTCOMES
        step.outcome = outcomes.get(step.exit_code, "broken")
        if stop is not None and stop.requested and step.outcome == "broken" and step.exit_code < 0:
            step.outcome = "interrupted"  # a step that does not catch the signal (pytest) dies of it
        log(f"[{step.name}] {step.outcome} (exit {step.exit_code}, {step.seconds}s)")
    outcomes = {s.outcome for s in steps}
    return (ExitCode.BROKEN if "broken" in outcomes else ExitCode.FOUND if "found" in outcomes
            else ExitCode.INTERRUPTED if "interrupted" in outcomes else ExitCode.OK)


def run_nightly(report_dir: Path, steps: list[Step], skip: frozenset[str], device: str) -> int:
    """The planned `steps` into `report_dir`, then nightly.json and the page, written also after SIGINT or
    SIGTERM (the step in flight stops and writes what it has, no later step starts). The exit code is the
    worst of the steps' and the page's verdict. The caller has checked its arguments and refused another
    run's folder (`reports.writers.refuse_other_runs`): nothing here is refused."""
    report_dir.mkdir(parents=True, exist_ok=True)
    with stop_on_signals() as stop:
        code = run_steps(steps, skip, stop=stop)
        stop.writing()
        write_report(report_dir / NIGHTLY, {"exit_code": code, "interrupted": stop.signal_name,
                                            "steps": [asdict(s) for s in steps]})
        campaign_found = any(s.name == "campaign" and s.outcome == "found" for s in steps)
        code = _render_and_judge(report_dir, code, device, campaign_found=campaign_found)
    return code


def _render_and_judge(report_dir: Path, code: int, device: str, *, campaign_found: bool) -> int:
    # The page's own verdict counts too: a surviving mutant or a missed planted bug is BROKEN (exit 3).
    began = time.time()
    rendered = subprocess.run([sys.executable, "-m", "harness", "report", str(report_dir)]).returncode
    index = report_dir / "index.html"
    if rendered == ExitCode.USAGE or not index.is_file() or index.stat().st_mtime < began - 1:
        print(f"error: the report could not be rendered (exit {rendered}): see the message above", file=sys.stderr)
        code = ExitCode.BROKEN
    else:
        code = max(code, rendered)
    print(f"nightly: exit {code}; report: {report_dir / 'index.html'}")
    if campaign_found:
        print(f"replay the campaign's failures with: python -m harness run --device {device} --profile nightly "
              f"--report-dir {report_dir} --from-db")
    return code
