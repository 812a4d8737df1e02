"""Contract probes: checks a campaign cannot make happen by itself, run once per target.

A fuzzed case never makes the snapshot build fail, so the PR-era rule "the snapshotted flag is set
only after a successful build" is probed directly: the build is made to raise, and the backend must
not declare PRE_REPLAY afterwards. Probes drive the reference's classes (and any target built from
them, the seeded bugs included).
"""

from __future__ import annotations

from typing import Callable, Optional

from harness.case import Batch, Case, Flags, Request
from harness.device import SimDevice
from harness.model.enums import ForwardMode, SharedReadEnds, SpeculativeAlgorithm
from harness.semantics import Semantics
from harness.world import PoolSizes, build_world


def _backend_with_batch(target, case: Case):
    device = SimDevice()
    session = target.open(case, device)
    fb = session.load(build_world(case, 0, PoolSizes.for_case(case)))
    backend = session.model_runner.attn_backend
    backend.init_forward_metadata(fb)
    return backend, fb


def flag_set_only_after_successful_build(target) -> Optional[str]:
    """PR-era: a snapshot build that raises must leave `prefill_shared_reads_snapshotted` unset."""
    case = Case(semantics=Semantics.PR, spec=SpeculativeAlgorithm.DFLASH,
                flags=Flags(SGLANG_ENABLE_PREFILL_WAR_READ_DONE=True), batches=(Batch(requests=(Request(5, 6),)),))
    backend, fb = _backend_with_batch(target, case)

    def failing_build(*args, **kwargs):
        raise RuntimeError("injected snapshot build failure")

    backend._build_sparse_prefill_chunk_cache = failing_build
    try:
        backend.prepare_prefill_shared_read_snapshot(fb, num_qo_tokens=fb.num_tokens)
    except RuntimeError:
        pass
    if backend.shared_read_ends(ForwardMode.EXTEND) is SharedReadEnds.PRE_REPLAY:
        return ("a snapshot build that raised left prefill_shared_reads_snapshotted set: PRE_REPLAY is declared "
                "with no snapshot")
    return None


PROBES: list[Callable[[object], Optional[str]]] = [flag_set_only_after_successful_build]


def run_probes(target) -> list[str]:
    """Messages of the probes that failed; a probe the target makes raise has failed too."""
    failures = []
    for probe in PROBES:
        try:
            message = probe(target)
        except Exception as exc:  # the target's own failure, reported, never a harness traceback
            message = f"{probe.__name__}: the target raised {type(exc).__name__}: {exc}"
        if message:
            failures.append(message)
    return failures
