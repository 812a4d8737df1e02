"""The contract between the harness and a system under test: `Target`, `Session` and the probe records.

A target opens one session per run of a case. The session owns the pools and the worker; the harness
loads each batch into it (`load_batch`), lets it run one overlap-loop iteration (`Session.step`), reads
back what it produced (the step's outputs and `Session.kv_state()`) and takes what it noted about its own
decisions (`Session.probe`, typed records: `Publish`, `Snapshot`, `Forward`, ...; declared in
`harness.probe`, re-exported here).

Point the harness at your own build with ``--target module:factory``, where ``factory()`` returns a
`Target`. Subclass `Target`: its optional capabilities are methods with defaults, so a target answers only
the questions it can (as pytest's hookspec.py documents each hook a plugin may implement).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Callable, Protocol

import torch

from harness.case import GRAPH_CONTRACTS, Case
from harness.model.pools import ForwardBatch
from harness.probe import (Dispatch, DraftGraphReplay, Forward, GraphReplay, LazyBuild, MetadataReuse, PlanKind, Planned,
                           PlanRead, Probe, ProbeRecord, Publish, Snapshot, SwaLocFallback, first, noted)
from harness.world import BatchWorld


class Session(Protocol):
    """One run of one case on one device: built by `Target.open`, used for that run only."""

    probe: Probe
    """Where the session's code notes its decisions (`Probe.note(record)`); the engine takes the records after
    each step."""
    req_to_token: torch.Tensor
    """The request-to-token table (row: a request's pool index; column: a position; entry: its full slot)."""
    full_to_swa: torch.Tensor
    """The full-slot to SWA-slot mapping (0: no SWA slot)."""
    full_to_hisparse: torch.Tensor
    """The full-slot to hierarchical-sparse slot mapping."""

    def load(self, world: BatchWorld) -> ForwardBatch:
        """Write the scheduler's allocation for this batch (tables, KV stores, sink) in place, on the current
        stream, and return the batch to run. Graphs keep the pool tensors: never reallocate them. The
        world's data is already on the case's device and serves both runs of the case: copy what you
        load, never write into it."""

    def step(self, fb: ForwardBatch, *, graph: bool, process_batch_result: Callable[[], None],
             after_launch: Callable[[], None]) -> dict[str, torch.Tensor]:
        """One iteration of the overlap loop: launch the forward (a graph replay when `graph` and a bucket
        fits), call `after_launch()` once it is launched, then `process_batch_result()` where the scheduler
        processes the previous result (the harness's mutations of the tables), honouring the read-done
        event or the barrier. Returns the forward's outputs by name."""

    def kv_state(self) -> dict[str, torch.Tensor]:
        """The KV stores after the step, by name (compared between the overlapped and the barriered run; the
        `kv` oracle reads `swa_kv`, `extra_kv` and `indexer_k` in the reference model's layout)."""

    # Optional: `observed_buffers() -> dict[str, torch.Tensor]`, the buffers the observer watches under the
    # names the declarations use, for a session whose KV lives elsewhere than `kv_state()`'s tensors (default:
    # `harness.observe.default_buffers`, the tables and `kv_state()`, a 3-D pool per layer as `name[layer]`).


class Target:
    """A system under test. Subclass it, set `name`, implement `open`; override an optional capability only
    where the target can answer it (the defaults answer "nothing to report")."""

    name: str = "target"
    """Shown in reports and in the replay command's comment."""
    semantics_supported: tuple[str, ...] = ("0.5.23",)
    """The `--semantics` the target implements; `triage --semantics auto` takes the first."""
    description: str = ""
    """What exactly is under test (a package's version and the adapter that drives it), for the summary and
    the page; empty: `name` says it all."""
    cannot_run: frozenset[str] = frozenset()
    """Switches (`Flags` field names) whose cases this target cannot run as the system does: a campaign never
    draws them (nor runs a seed case with one), and `open` refuses a case that has one."""

    graph_contracts: tuple[str, ...] = GRAPH_CONTRACTS
    """The prefill-graph contracts (`Case.graph_contract`) the system has: a campaign replays every drawn case
    under the first of them where the drawn one is not among them (`strategies.with_contract`), and `open`
    refuses a graph replay under another. Default: both the harness models."""

    uniform_draft_width: bool = False
    """Whether the system gives every request of an EAGLE-family case's verify and draft-extend batches its one draft
    width (SGLang's EAGLE worker: the server's `--speculative-num-draft-tokens`), and of a CP case's whatever its
    algorithm (SGLang verifies at one width under CP): a campaign then draws such cases at one width
    (`strategies.with_draft_width`). False: the widths drawn, uneven ones included."""

    fixed_dims: Mapping[str, object] = MappingProxyType({})
    """`Dims` fields this target runs at these values only (sizes the system under test asserts): a campaign
    draws every case with them (`strategies.cases(dims=...)`), the reference model runs the same case at the
    same sizes, and `open` refuses a case with others. Empty: any sizes."""

    def open(self, case: Case, device) -> Session:
        """A new session for one run of `case` on `device` (a `harness.device` device: its streams, events
        and `launch(op, fn, reads=..., writes=...)`, so the same code runs on the simulator and on CUDA)."""
        raise NotImplementedError(f"{type(self).__name__}.open")

    def reference_differences(self, case: Case, device_name: str) -> dict[str, str]:
        """The `reference` oracle's question, for a target that is not the reference model: run `case` on
        both and return {field: what differs} (a field is a probe record's, a chunk cache tensor, the
        attention output, a declaration). Raising is a `target-raised` finding. Default: no differences
        (the model itself, or a target that cannot be compared with it)."""
        return {}

    def contract_breaks(self) -> list[str]:
        """The `contract` oracle's question, asked once per target: attributes the target's source reads as
        `self.X` but never assigns, one line each. Default: none (a target without a source check)."""
        return []


def load_batch(session: Session, device, world: BatchWorld) -> ForwardBatch:
    """A batch's inputs loaded on the forward stream, so they are ordered before the forward reads them:
    on torch's default stream they would not be (PyTorch's streams do not wait for it; under racecheck's
    slowness SGLang's kernel once read the tables before the load had written them)."""
    with device.stream(device.forward_stream):
        return session.load(world)


__all__ = ["Dispatch", "DraftGraphReplay", "Forward", "GraphReplay", "LazyBuild", "MetadataReuse", "PlanKind", "PlanRead",
           "Planned", "Probe", "ProbeRecord", "Publish", "Session", "Snapshot", "SwaLocFallback", "Target", "first",
           "load_batch", "noted"]
