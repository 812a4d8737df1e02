"""One case, judged: the overlapped run, the barriered reference, and the oracles.

The overlapped run is the loop as SGLang runs it: the schedule stream mutates the shared tables as
soon as the target's barrier lets it. The barriered run is the same case with the schedule stream
waiting for the whole forward first. Both are judged by every oracle registered in `harness/oracles/`
(one module each: differential, happens-before, policy, float64, kv, execution, reference, contract;
`harness.oracles.oracle` registers another). The records the runs produce and the findings are in
`harness/findings.py`.
"""

from __future__ import annotations

import os
import shlex
import time
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional

from harness.case import Case, Mutation
from harness.device import DeviceKind, OpFailed, context_error, make_device
from harness.errors import HarnessError
from harness.findings import CaseResult, Finding, RunRecord, out_of_memory_refused, refuse_out_of_memory
from harness.mutator import Mutator
from harness.oracles import Judged, apply_oracles
from harness.targets import REFERENCE, TargetSpec, load_batch
from harness.world import CaseWorlds

__all__ = ["CaseResult", "Exploration", "Finding", "RunRecord", "execute", "explore", "oracle_findings",
           "replay_command", "run_case"]


def execute(target, case: Case, device_name: str, *, schedule: str = "adversarial", barriered: bool = False,
            poison_ok: bool = True, observe: bool = False, worlds: Optional[CaseWorlds] = None) -> RunRecord:
    """One run of a case. `observe`: the tracker also judges what the target is observed to touch
    (the session's tables, KV pools and per-batch tensors), and checks its declarations against it.
    `worlds`: the batches' data, shared with the case's other runs (drawn here when not given).
    The outputs stay on the device the case ran on: the oracles compare them there."""
    worlds = worlds if worlds is not None else CaseWorlds(case)
    device = make_device(device_name, schedule=schedule, observe=observe)
    # The race window is widened where a race can happen: the barriered run's scheduler waits for the
    # whole forward, so a delay there would only cost time.
    device.race_delay = 0 if barriered else case.delay_cycles
    record = RunRecord(forward_stream=device.forward_stream.id)
    began = time.perf_counter()
    try:
        with device.observing():
            session = target.open(case, device)
    except HarnessError:
        raise
    except Exception as exc:  # the target raised building its session (its own __init__s): a finding too
        refuse_out_of_memory(exc)
        record.crash = (0, f"opening the session: {_raised(exc)}")
        return _finished(record, device, schedule)
    if device.observer is not None:
        device.observer.register_session(session)
    record.setup_seconds += time.perf_counter() - began
    for index, batch in enumerate(case.batches):
        world = worlds[index, device.torch_device]
        record.worlds.append(world)
        began = time.perf_counter()
        with device.observing():
            fb = load_batch(session, device, world)
        if device.observer is not None:
            device.observer.register_batch(fb)
        record.setup_seconds += time.perf_counter() - began
        session.current_batch = fb
        mutator = Mutator(world, session, device, poison_ok=poison_ok)
        after_launch = ((lambda: device.wait_stream(device.schedule_stream, device.forward_stream))
                        if barriered else (lambda: None))
        began = time.perf_counter()
        if not barriered and case.delay_cycles:
            # The forward stream is held before the forward: a scheduler that does not wait for this
            # batch's event (or waits on the wrong one) then really overtakes its reads.
            with device.stream(device.forward_stream):
                device.delay(case.delay_cycles)
        try:
            with device.observing():
                outputs = session.step(fb, graph=batch.graph,
                                       process_batch_result=_processing(device, mutator, batch.mutations),
                                       after_launch=after_launch)
                device.synchronize()
        except OpFailed as exc:
            record.crash = (index, str(exc))
        except HarnessError:
            raise
        except Exception as exc:  # the target raised on the host: a finding, never a harness traceback
            refuse_out_of_memory(exc)
            record.crash = (index, _raised(exc))
        record.sut_seconds += time.perf_counter() - began
        record.applied.append(list(mutator.applied))
        record.notes.append(session.probe.take())
        record.timeline.append(device.tracker.take_timeline())
        record.overlap_ms.append(None if record.crash else device.take_overlap_ms())
        if record.crash:
            break
        began = time.perf_counter()
        captured = {name: t.detach().clone() for name, t in outputs.items()}
        captured.update({f"pool.{name}": t.detach().clone() for name, t in session.kv_state().items()})
        record.outputs.append(captured)
        record.copy_seconds += time.perf_counter() - began
    return _finished(record, device, schedule)


def _raised(exc: BaseException) -> str:
    """`exc` as a crash finding words it: its type and message, and the innermost frame it was raised in (on
    CUDA run with CUDA_LAUNCH_BLOCKING=1 that is the op that failed on the device), so that a crash names its
    line without a debugger."""
    frames = [(_short_path(f.filename), f.lineno, f.name) for f in traceback.extract_tb(exc.__traceback__)]
    if not frames:
        return f"{type(exc).__name__}: {exc}"
    where = "raised at {}:{} in {}".format(*frames[-1])
    callers = [f for f in frames if not f[0].startswith(_LIBRARY_PATHS)]
    if callers and callers[-1] != frames[-1]:  # the op failed in torch: the lines that called it
        where += ", called from " + " <- ".join("{}:{} in {}".format(*f) for f in reversed(callers[-3:]))
    if "CUDA error" in str(exc) and os.environ.get("CUDA_LAUNCH_BLOCKING") != "1":
        where += "; a CUDA error surfaces at a later call: replay with CUDA_LAUNCH_BLOCKING=1 to name the op that failed"
    return f"{type(exc).__name__}: {exc} ({where})"


_LIBRARY_PATHS = ("torch/", "triton/", "contextlib", "functools", "unittest/", "harness/observe/", "harness/device/memcheck")


def _short_path(filename: str) -> str:
    """A frame's file from its package down (`sglang/srt/...`, `harness/...`): no machine path in a report."""
    path = Path(filename)
    parts = path.parts
    roots = [i for i, part in enumerate(parts) if part in ("site-packages", "dist-packages")]
    if roots:
        return "/".join(parts[roots[-1] + 1:])
    if path.is_relative_to(Path.cwd()):
        return path.relative_to(Path.cwd()).as_posix()
    for i, part in enumerate(parts):
        if part in ("harness", "sglang", "torch", "triton"):
            return "/".join(parts[i:])
    return path.name


def _processing(device, mutator: Mutator, mutations: tuple[Mutation, ...]) -> Callable[[], None]:
    """The scheduler's processing of a batch's result: a checkpoint of where its stream stands first (which of
    the forward's work it waited for: the fast path's question, `oracles/fast_path.py`) and, on a device with a
    clock, when it got there against the forward's end (`RunRecord.overlap_ms`), then the mutations."""

    def process() -> None:
        device.tracker.checkpoint(device.current_stream.id)
        device.mark_processing()
        mutator.issue(mutations)

    return process


def _finished(record: RunRecord, device, schedule: str) -> RunRecord:
    """`record` with what the device saw of the run: the tracker's conflicts, the observer's undeclared
    accesses, the order the streams ran in and the race delays."""
    record.conflicts = device.tracker.conflicts
    record.undeclared = list(device.observer.undeclared) if device.observer is not None else []
    record.trace = device.trace()
    forced = device.forced_string()
    record.schedule = schedule if forced is None else forced
    record.decisions = [(d.chosen, d.options) for d in device.decisions]
    record.delays = list(device.delays)
    record.delay_seconds = device.race_delay_seconds()
    record.race_window = device.race_window()
    return record


def replay_command(case: Case, *, target_spec: TargetSpec, device: str, schedule: str,
                   oracles: Optional[frozenset] = None) -> str:
    """The one command that judges `case` again as it was judged: the server settings this process has from its
    environment first (`TargetSpec.environment`), then the replay with the target, device, schedule and oracles."""
    parts = [*target_spec.environment(), "python", "-m", "harness", "replay", *target_spec.arguments(),
             "--device", device, "--schedule", schedule]
    if oracles:
        parts += ["--oracles", ",".join(sorted(oracles))]
    parts += ["--case", case.to_json()]
    return " ".join(shlex.quote(p) for p in parts)


def run_case(target, case: Case, device_name: str = "cpu", *, schedule: str = "adversarial",
             target_spec: TargetSpec = REFERENCE, oracles: Optional[frozenset] = None,
             observe: bool = True) -> CaseResult:
    """Judge one case of `target`, which `target_spec` names (in the replay command); `oracles` keeps only
    those oracles' findings (to show which one catches what); `observe=False` leaves the tracker with the
    declared accesses only (to measure the observer); by default the observer watches the overlapped run on
    every device."""
    case.validate()
    with out_of_memory_refused():
        return _judged(target, case, device_name, schedule=schedule, target_spec=target_spec, oracles=oracles,
                       observe=observe)


def _judged(target, case: Case, device_name: str, *, schedule: str, target_spec: TargetSpec,
            oracles: Optional[frozenset], observe: bool) -> CaseResult:
    start = time.perf_counter()
    kind = DeviceKind(device_name)
    poison_ok = kind.poison_out_of_range
    worlds = CaseWorlds(case)
    # Observed: the run the happens-before oracle judges. The barriered run is only compared by value.
    overlapped = execute(target, case, device_name, schedule=schedule, poison_ok=poison_ok, observe=observe,
                         worlds=worlds)
    oracle_seconds: dict[str, float] = {}
    lost = context_error(device_name) if overlapped.crash else None
    if lost:  # nothing more can run on the device in this process: the overlapped run's crash is the finding
        barriered = RunRecord(crash=(overlapped.crash[0], f"not run: the overlapped run left the CUDA context unusable ({lost})"))
        findings = [Finding("execution", "context-lost", "the overlapped run raised and left the CUDA context unusable, "
                            f"so the barriered run could not be judged: {overlapped.crash[1]}", overlapped.crash[0])]
    else:
        barriered = execute(target, case, device_name, barriered=True, poison_ok=poison_ok, worlds=worlds)
        findings = oracle_findings(case, overlapped, barriered, target=target, device_name=device_name,
                                   oracles=oracles, seconds=oracle_seconds)
    if kind.real_concurrency:  # the window each finding was found in
        findings = [replace(f, details={**f.details, "race_window": overlapped.race_window}) for f in findings]
    result = CaseResult(case, findings, overlapped, barriered, time.perf_counter() - start,
                        world_seconds=worlds.seconds, oracle_seconds=oracle_seconds)
    replay_schedule = (schedule if kind.real_concurrency or schedule == "adversarial"
                       else f"forced:{overlapped.schedule}")
    result.replay = replay_command(case, target_spec=target_spec, device=device_name, schedule=replay_schedule,
                                   oracles=oracles)
    return result


def oracle_findings(case: Case, overlapped: RunRecord, barriered: RunRecord, *, target=None,
                    device_name: str = "cpu", oracles: Optional[frozenset] = None,
                    seconds: Optional[dict[str, float]] = None) -> list[Finding]:
    """Every registered oracle (`harness/oracles/`) on one judged case; the findings `oracles` selects.
    Without a target (one interleaving of an exploration) the oracles that ask the target do not run.
    `seconds`, when given, gets each oracle's time."""
    return apply_oracles(Judged(case, overlapped, barriered, target=target, device_name=device_name,
                                selected=oracles), seconds=seconds)


@dataclass
class Exploration:
    explored: int = 0
    truncated: bool = False
    failing: list[tuple[str, Finding]] = field(default_factory=list)
    by_oracle: dict[str, int] = field(default_factory=dict)  # interleavings with a finding of each oracle


def explore(target, case: Case, *, bound: int = 500, oracles: Optional[frozenset] = None) -> Exploration:
    """Every order the stream and event edges allow, depth first over the simulator's decisions
    (stateless, as CHESS does: each order is a fresh run forced along a prefix). Each order is judged
    by every oracle `oracles` enables (all when None), as a campaign judges a case."""
    case.validate()
    worlds = CaseWorlds(case)
    barriered = execute(target, case, "cpu", barriered=True, worlds=worlds)
    outcome = Exploration()
    stack = [""]
    seen = set()
    while stack:
        if outcome.explored >= bound:
            outcome.truncated = True
            break
        prefix = stack.pop()
        run = execute(target, case, "cpu", schedule=f"forced:{prefix}", worlds=worlds)
        taken = run.schedule
        if taken in seen:
            continue
        seen.add(taken)
        outcome.explored += 1
        findings = oracle_findings(case, run, barriered, oracles=oracles)
        if findings:
            outcome.failing.append((taken, findings[0]))
            for name in dict.fromkeys(f.oracle for f in findings):
                outcome.by_oracle[name] = outcome.by_oracle.get(name, 0) + 1
        for i in range(len(prefix), len(run.decisions)):
            chosen, options = run.decisions[i]
            for alternative in options:
                if alternative != chosen:
                    stack.append(taken[:i] + alternative)
    return outcome

