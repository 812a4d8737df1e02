"""The publication policy, written down once, independently of any target's code.

`expected_publish` is what SGLang's design says must happen for a batch; the policy oracle compares
it with what the target did. Publishing where it must not is a correctness risk; not publishing
where it should is a lost fast path (a performance regression, #34816).
"""

from __future__ import annotations

from harness.case import Batch, Case
from harness.model.enums import ForwardMode
from harness.model.runners import generate_prefill_cuda_graph_batch_sizes

GRAPH_MAX_BS = 2048


def graph_bucket(num_tokens: int) -> int | None:
    """The replay bucket, or None when the graph runner must refuse (beyond 2x padding or the max)."""
    for size in generate_prefill_cuda_graph_batch_sizes(GRAPH_MAX_BS):
        if size >= num_tokens:
            return size if size <= 2 * num_tokens else None
    return None


def runs_graph(case: Case, batch: Batch) -> bool:
    """Whether the prefill graph replays `batch`: a graph batch within a bucket, on a server that has the prefill graph
    (`Flags.has_prefill_graph`: a CP server of DSV4 has none)."""
    return (batch.graph and case.flags.has_prefill_graph and batch.mode is not ForwardMode.IDLE
            and graph_bucket(batch.num_tokens) is not None)


def expected_publish(case: Case, batch: Batch) -> tuple[bool, str]:
    """(publish?, the rule that decided)."""
    flags, spec = case.flags, case.spec
    mode = batch.mode
    if mode is ForwardMode.MIXED and not flags.cp_active and not runs_graph(case, batch):
        mode = ForwardMode.EXTEND  # every release's eager runner (0.5.19 on) runs a mixed batch as EXTEND
    if mode is not ForwardMode.EXTEND:
        return False, f"mode {batch.mode.name} is not EXTEND"
    if not flags.prefill_read_done_enabled(case.semantics):
        return False, "SGLANG_ENABLE_PREFILL_WAR_READ_DONE is off"
    if flags.SGLANG_FORCE_COARSE_WAR_BARRIER and case.semantics.coarse_barrier_closes_publish:
        # PR-era: the event is still recorded; the scheduler ignores it under the coarse flag.
        return False, "SGLANG_FORCE_COARSE_WAR_BARRIER is set"
    if flags.cp_shards(mode, batch.num_tokens):
        return False, "CP is active (rank-local query geometry)"
    if flags.hisparse:
        return False, "HiSparse translates through full_to_hisparse in every layer"
    if flags.offloads_kv():
        return False, "hierarchical cache / storage / LMCache offload is on"
    if case.semantics.dflash_family_only and not spec.is_dflash_family():
        return False, f"PR-era: spec {spec.name} is not DFLASH-family"
    if not spec.supports_prefill_shared_read_done():
        return False, f"spec {spec.name} has a later reader (draft extend) or is not audited"
    if runs_graph(case, batch) and case.graph_contract == "bcg":
        return False, "breakable-graph captured-metadata replay builds no snapshot"
    return True, "EXTEND with the snapshot built, no gate closed"
