"""One case, judged: the overlapped run, the barriered reference, and the oracles.

The overlapped run is the loop as SGLang runs it: the schedule stream mutates the shared tables as
soon as the target's barrier lets it. The barriered run is the same case with the schedule stream
waiting for the whole forward first. The oracles:

- ``differential``: both runs' outputs (attention, draft outputs, KV pools, backups) equal bit for bit;
- ``happens-before``: no unordered conflicting access pair in the overlapped run's program;
- ``policy``: publication as the design says, and the target's own decisions consistent;
- ``float64``: the barriered attention matches a float64 reference computed from positions;
- ``kv``: the barriered run wrote exactly the KV entries the batch owns, nothing else;
- ``execution``: a run that raised, and a planned mutation that never ran;
- ``reference``: for a target that is not the model (the real SGLang code), its chunk cache, publish
  decision, declarations and attention against the model's on the same case;
- ``contract``: for such a target, an attribute its source reads as ``self.X`` but never assigns (a
  break the harness's own construction of the object would hide), checked once per target.
"""

from __future__ import annotations

import re
import shlex
import time
from dataclasses import dataclass, field, replace
from typing import Optional

import torch

from harness.case import Case
from harness.device import OpFailed, make_device
from harness.errors import HarnessError, InvalidArgument
from harness.hb import Conflict
from harness.model.attention import reference_attention
from harness.mutator import Mutator
from harness.observe import UndeclaredAccess
from harness.policy import expected_publish, runs_graph
from harness.target import load_batch
from harness.world import BatchWorld, PoolSizes, build_world, kv_contents

FLOAT64_ATOL = 1e-4
FLOAT64_MAX_ROWS = 256  # rows checked per layer on big batches: both ends plus an even sample


@dataclass(frozen=True)
class Finding:
    oracle: str
    kind: str
    message: str
    batch: int = 0
    severity: str = "correctness"  # or "performance"
    details: dict = field(default_factory=dict)


@dataclass
class RunRecord:
    """What one execution of a case produced, batch by batch, copied to the CPU."""

    outputs: list[dict[str, torch.Tensor]] = field(default_factory=list)
    notes: list[list[tuple[str, dict]]] = field(default_factory=list)
    applied: list[list[str]] = field(default_factory=list)
    worlds: list[BatchWorld] = field(default_factory=list)
    conflicts: list[Conflict] = field(default_factory=list)
    undeclared: list[UndeclaredAccess] = field(default_factory=list)
    crash: Optional[tuple[int, str]] = None
    trace: list[str] = field(default_factory=list)
    schedule: str = ""
    decisions: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    delays: list[int] = field(default_factory=list)
    race_window: dict = field(default_factory=dict)
    sut_seconds: float = 0.0  # inside the target's step and the device's execution of it
    setup_seconds: float = 0.0  # inside the target's own open and load (its pools and its forward batch)


@dataclass
class CaseResult:
    case: Case
    findings: list[Finding]
    overlapped: RunRecord
    barriered: RunRecord
    seconds: float
    replay: str = ""


def execute(target, case: Case, device_name: str, *, schedule: str = "adversarial", barriered: bool = False,
            poison_ok: bool = True, observe: bool = False) -> RunRecord:
    """One run of a case. `observe`: the tracker also judges what the target is observed to touch
    (the session's tables, KV pools and per-batch tensors), and checks its declarations against it."""
    device = make_device(device_name, schedule=schedule, observe=observe)
    device.race_delay = case.delay_cycles
    record = RunRecord()
    began = time.perf_counter()
    with device.observing():
        session = target.open(case, device)
    if device.observer is not None:
        device.observer.register_session(session)
    record.setup_seconds += time.perf_counter() - began
    sizes = PoolSizes.for_case(case)
    for index, batch in enumerate(case.batches):
        world = build_world(case, index, sizes)
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
            # The forward stream is still busy with the previous batch: a scheduler that does not
            # wait for this batch's event (or waits on the wrong one) then really overtakes its reads.
            with device.stream(device.forward_stream):
                device.delay(case.delay_cycles)
        try:
            with device.observing():
                outputs = session.step(fb, graph=batch.graph,
                                       process_batch_result=lambda: mutator.issue(batch.mutations),
                                       after_launch=after_launch)
                device.synchronize()
        except OpFailed as exc:
            record.crash = (index, str(exc))
        except HarnessError:
            raise
        except Exception as exc:  # the target raised on the host: a finding, never a harness traceback
            record.crash = (index, f"{type(exc).__name__}: {exc}")
        record.sut_seconds += time.perf_counter() - began
        record.applied.append(list(mutator.applied))
        record.notes.append(session.probe.take())
        if record.crash:
            break
        captured = {name: t.detach().cpu().clone() for name, t in outputs.items()}
        captured.update({f"pool.{name}": t.detach().cpu().clone() for name, t in session.kv_state().items()})
        record.outputs.append(captured)
    record.conflicts = device.tracker.conflicts
    record.undeclared = list(device.observer.undeclared) if device.observer is not None else []
    record.trace = device.trace()
    record.schedule = device.forced_string() if hasattr(device, "forced_string") else schedule
    record.decisions = [(d.chosen, d.options) for d in getattr(device, "decisions", [])]
    record.delays = list(device.delays)
    record.race_window = device.race_window()
    return record


def replay_command(case: Case, *, target: str, device: str, schedule: str, mutant: Optional[str] = None,
                   oracles: Optional[frozenset] = None) -> str:
    parts = ["python", "-m", "harness", "replay", "--target", target]
    if mutant:
        parts += ["--mutant", mutant]
    parts += ["--device", device, "--schedule", schedule]
    if oracles:
        parts += ["--oracles", ",".join(sorted(oracles))]
    parts += ["--case", case.to_json()]
    return " ".join(shlex.quote(p) for p in parts)


ORACLES = ("differential", "happens-before", "policy", "float64", "kv", "execution", "reference", "contract")


def run_case(target, case: Case, device_name: str = "cpu", *, schedule: str = "adversarial",
             target_spec: str = "reference", mutant: Optional[str] = None,
             oracles: Optional[frozenset] = None, observe: bool = True) -> CaseResult:
    """Judge one case; `oracles` keeps only those oracles' findings (to show which one catches what);
    `observe=False` leaves the tracker with the declared accesses only (to measure the observer);
    by default the observer watches the overlapped run on every device."""
    case.validate()
    start = time.perf_counter()
    poison_ok = device_name == "cpu"  # out-of-range reads kill a CUDA context; there poison stays in range
    # Observed: the run the happens-before oracle judges. The barriered run is only compared by value.
    overlapped = execute(target, case, device_name, schedule=schedule, poison_ok=poison_ok, observe=observe)
    barriered = execute(target, case, device_name, barriered=True, poison_ok=poison_ok)
    findings = [f for f in judge(case, overlapped, barriered) if oracles is None or f.oracle in oracles]
    if hasattr(target, "reference_differences") and barriered.crash is None and (oracles is None or "reference" in oracles):
        findings += reference_oracle(target, case, device_name)
    if hasattr(target, "contract_breaks") and (oracles is None or "contract" in oracles):
        findings += [Finding("contract", "never-assigned", f"{b} (static check of the installed source, as "
                                                           f"`python -m harness triage --static-only` runs it)")
                     for b in target.contract_breaks()]
    if device_name != "cpu":  # where the race was real: the window each finding was found in
        findings = [replace(f, details={**f.details, "race_window": overlapped.race_window}) for f in findings]
    result = CaseResult(case, findings, overlapped, barriered, time.perf_counter() - start)
    replay_schedule = f"forced:{overlapped.schedule}" if device_name == "cpu" and schedule != "adversarial" else schedule
    result.replay = replay_command(case, target=target_spec, device=device_name, schedule=replay_schedule,
                                   mutant=mutant, oracles=oracles)
    return result


# -- the oracles -----------------------------------------------------------------------------------------

def parse_oracles(text: Optional[str]) -> Optional[frozenset]:
    if not text:
        return None
    names = frozenset(n.strip() for n in text.split(",") if n.strip())
    unknown = sorted(names - set(ORACLES))
    if unknown or not names:
        raise InvalidArgument(f"--oracles: unknown {', '.join(unknown) or '(empty)'}; allowed: {', '.join(ORACLES)}")
    return names


def judge(case: Case, overlapped: RunRecord, barriered: RunRecord) -> list[Finding]:
    findings: list[Finding] = []
    findings += execution_oracle(case, overlapped, barriered)
    findings += differential_oracle(overlapped, barriered)
    findings += hb_oracle(overlapped)
    findings += policy_oracle(case, overlapped)
    if barriered.crash is None:
        findings += float64_oracle(case, barriered)
        findings += kv_oracle(barriered)
    return findings


def reference_oracle(target, case: Case, device_name: str) -> list[Finding]:
    """A target that is not the reference model (the real SGLang code) against the model, field by field,
    on the same case with nothing mutating the tables: a regression that is no race (a gate, a threshold,
    a declaration) shows here even though both of the target's own runs agree."""
    try:
        diffs = target.reference_differences(case, device_name)
    except HarnessError:
        raise
    except Exception as exc:  # the target raised on the host: a finding, never a harness traceback
        return [Finding("reference", "target-raised", f"comparing with the reference model, the target raised "
                                                      f"{type(exc).__name__}: {exc}")]
    return [Finding("reference", "reference-mismatch", f"the real code and the reference model differ in {name}: {why}",
                    int(m.group(1)) if (m := re.match(r"batch (\d+):", why)) else 0)
            for name, why in diffs.items()]


def execution_oracle(case: Case, overlapped: RunRecord, barriered: RunRecord) -> list[Finding]:
    out = []
    if barriered.crash:
        batch, message = barriered.crash
        out.append(Finding("execution", "target-raised", f"the target raised even with a full barrier: {message}", batch))
    elif overlapped.crash:
        batch, message = overlapped.crash
        out.append(Finding("differential", "crash-under-overlap",
                           f"the overlapped run raised, the barriered run did not: {message}", batch))
    for index, batch in enumerate(case.batches[: len(overlapped.applied)]):
        if batch.mutations and not overlapped.applied[index] and not overlapped.crash:
            out.append(Finding("execution", "mutation-never-ran",
                               f"batch {index} planned {[m.kind for m in batch.mutations]} but no mutation ran", index))
    return out


def differential_oracle(overlapped: RunRecord, barriered: RunRecord) -> list[Finding]:
    out = []
    for index, (a, b) in enumerate(zip(overlapped.outputs, barriered.outputs)):
        for name in sorted(set(a) | set(b)):
            if name not in a or name not in b:
                out.append(Finding("differential", "output-missing", f"output {name!r} exists in only one run", index))
                continue
            x, y = a[name], b[name]
            if x.shape != y.shape or not torch.equal(x, y):
                out.append(Finding("differential", "output-differs", _describe_difference(name, x, y, barriered.worlds[index]),
                                   index, details={"tensor": name}))
    return out


def _describe_difference(name: str, x: torch.Tensor, y: torch.Tensor, world: BatchWorld) -> str:
    if x.shape != y.shape:
        return f"{name}: shape {tuple(x.shape)} under overlap, {tuple(y.shape)} with the barrier"
    diff = (x != y) & ~(x.isnan() & y.isnan()) if x.is_floating_point() else x != y
    first = [int(i) for i in diff.nonzero()[0]]
    where = f"index {first}"
    if name in ("attention", "draft_extend"):
        row = first[1] if name == "attention" else first[0]
        rows = list(world.token_rows())
        if row < len(rows):
            r, pos = rows[row]
            where = f"request {r} (pool row {world.req_pool_idx[r]}), token row {row} at position {pos}, index {first}"
    count = int(diff.sum())
    return (f"{name}: {count} element(s) differ from the barriered run; first at {where}: "
            f"overlapped {x[tuple(first)].item():.6g}, barriered {y[tuple(first)].item():.6g}")


def hb_oracle(run: RunRecord) -> list[Finding]:
    """Unordered conflicting pairs, declared or observed; and every observed access to a shared buffer
    that its operation did not declare (one finding per op, buffer and kind)."""
    findings = [Finding("happens-before", "unordered-access", str(c),
                        details={"buffer": c.earlier.buffer, "ops": [c.earlier.op, c.later.op],
                                 "frames": [c.earlier.frame, c.later.frame]})
                for c in run.conflicts]
    seen = set()
    for access in run.undeclared:
        key = (access.op, access.buffer, access.is_write)
        if key not in seen:
            seen.add(key)
            findings.append(Finding("happens-before", "undeclared-access", str(access),
                                    details={"buffer": access.buffer, "ops": [access.op], "frames": [access.frame]}))
    return findings


def policy_oracle(case: Case, run: RunRecord) -> list[Finding]:
    out = []
    for index, notes in enumerate(run.notes):
        batch = case.batches[index]
        kinds = [k for k, _ in notes]
        published = "publish" in kinds
        if run.crash and run.crash[0] == index and not published:
            continue
        want, rule = expected_publish(case, batch)
        if published and not want:
            out.append(Finding("policy", "unexpected-publish", f"batch {index} published although {rule}", index))
        elif want and not published:
            out.append(Finding("policy", "missed-fast-path",
                               f"batch {index} should publish ({rule}) but did not: the scheduler falls back to "
                               "the coarse barrier", index, severity="performance"))
        out += _decision_checks(case, index, notes, published)
    return out


def _decision_checks(case: Case, index: int, notes, published: bool) -> list[Finding]:
    out = []
    batch = case.batches[index]
    first = {k: d for k, d in reversed(notes)}
    for kind, data in notes:
        if kind == "metadata_reuse" and not (data["cache_reset"] and data["flag_reset"]):
            out.append(Finding("policy", "metadata-not-reset",
                               f"batch {index}: reused graph metadata kept {'the sparse cache' if not data['cache_reset'] else 'the snapshotted flag'}"
                               " from an earlier replay", index))
        if kind == "publish" and data["stream"] != "forward":
            out.append(Finding("policy", "event-on-wrong-stream",
                               f"batch {index}: the read-done event was recorded on the {data['stream']} stream", index))
    if not published:
        return out
    if "snapshot" not in first:
        out.append(Finding("policy", "publish-without-snapshot",
                           f"batch {index} published but the backend never built its snapshot", index))
        return out
    snap, fwd = first["snapshot"], first.get("forward")
    if fwd is not None and snap["sparse"] != fwd["sparse"]:
        out.append(Finding("policy", "sparse-decision-disagrees",
                           f"batch {index}: the snapshot decided {'sparse' if snap['sparse'] else 'dense'} at "
                           f"{snap['num_qo_tokens']} tokens, the forward {'sparse' if fwd['sparse'] else 'dense'} "
                           f"at {fwd['rows']} rows", index))
    if fwd is not None and snap["num_qo_tokens"] != fwd["rows"]:
        out.append(Finding("policy", "snapshot-geometry",
                           f"batch {index}: snapshot built for {snap['num_qo_tokens']} query rows, the forward runs "
                           f"{fwd['rows']}" + (" (graph replay must snapshot at the padded bucket)" if runs_graph(batch) else ""),
                           index))
    for kind, data in notes:
        if kind in ("lazy_build", "swa_loc_fallback"):
            out.append(Finding("policy", "read-after-publish",
                               f"batch {index}: {kind.replace('_', ' ')} read the live tables after the event was published",
                               index))
    return out


def float64_oracle(case: Case, run: RunRecord) -> list[Finding]:
    out = []
    for index, outputs in enumerate(run.outputs):
        world = run.worlds[index]
        if "attention" not in outputs or world.num_tokens == 0:
            continue
        got = outputs["attention"]
        rows = _rows_to_check(world.num_tokens)
        for layer in range(len(case.dims.layer_ratios)):
            want = reference_attention(world, layer, rows=rows)
            err = (got[layer, rows].double() - want).abs()
            worst = float(err.max()) if err.numel() else 0.0
            if not worst <= FLOAT64_ATOL:  # NaN fails too
                flat = int(err.flatten().nan_to_num(float("inf")).argmax())
                row = rows[flat // (err.shape[1] * err.shape[2])]
                r, pos = list(world.token_rows())[row]
                out.append(Finding("float64", "attention-mismatch",
                                   f"batch {index} layer {layer} (ratio {case.dims.layer_ratios[layer]}): max error "
                                   f"{worst:.3g} > {FLOAT64_ATOL} at token row {row} (request {r}, position {pos})", index))
                break
    return out


def _rows_to_check(total: int) -> list[int]:
    if total <= FLOAT64_MAX_ROWS:
        return list(range(total))
    step = total / (FLOAT64_MAX_ROWS - 2)
    return sorted({0, total - 1, *(int(i * step) for i in range(FLOAT64_MAX_ROWS - 2))})


def kv_oracle(run: RunRecord) -> list[Finding]:
    out = []
    for index, outputs in enumerate(run.outputs):
        for name, (where, values) in kv_contents(run.worlds[index], after_forward=True).items():
            got = outputs[f"pool.{name}"]
            want = torch.zeros_like(got)
            want[where] = values
            owned = torch.zeros(got.shape[:-1], dtype=torch.bool)
            owned[where] = True
            diff = (got != want).any(dim=-1)
            diff[..., 0] = False  # the dummy slot 0 takes padded and cleared writes
            if bool(diff.any()):
                first = [int(i) for i in diff.nonzero()[0]]
                wrong_owned = bool(owned[tuple(first)])
                out.append(Finding("kv", "wrong-kv-slot" if wrong_owned else "foreign-kv-write",
                                   f"batch {index}: {name} at {'(layer, slot)' if got.dim() == 3 else 'slot'} {first} "
                                   f"{'holds a wrong value' if wrong_owned else 'was written although the batch does not own it'}"
                                   f" ({int(diff.sum())} slot(s) in all)", index))
    return out



@dataclass
class Exploration:
    explored: int = 0
    truncated: bool = False
    failing: list[tuple[str, Finding]] = field(default_factory=list)
    by_oracle: dict[str, int] = field(default_factory=dict)  # interleavings with a finding of each oracle


def explore(target, case: Case, *, bound: int = 500, target_spec: str = "reference",
            mutant: Optional[str] = None, oracles: Optional[frozenset] = None) -> Exploration:
    """Every order the stream and event edges allow, depth first over the simulator's decisions
    (stateless, as CHESS does: each order is a fresh run forced along a prefix). Each order is judged
    by every oracle `oracles` enables (all when None), as a campaign judges a case."""
    case.validate()
    barriered = execute(target, case, "cpu", barriered=True)
    outcome = Exploration()
    stack = [""]
    seen = set()
    while stack:
        if outcome.explored >= bound:
            outcome.truncated = True
            break
        prefix = stack.pop()
        run = execute(target, case, "cpu", schedule=f"forced:{prefix}")
        taken = run.schedule
        if taken in seen:
            continue
        seen.add(taken)
        outcome.explored += 1
        findings = [f for f in judge(case, run, barriered) if oracles is None or f.oracle in oracles]
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

