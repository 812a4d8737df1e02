"""Bugs put back into the real SGLang source: does the campaign against `--target sglang` find them?

Each mutant is one textual edit of the installed sglang (a regression someone could commit: a gate dropped,
a snapshot step skipped, an off-by-one). The table is the installed release's: `MUTANTS` for 0.5.23, the
resolver design; `PR_EARLY_MUTANTS` for 0.5.19 and 0.5.20, the PR's own design (`PR_ERA_MUTANTS`: what its
unit tests pin down, and its code paths) and the rows of its backend's own init, forward and graph refresh;
`PR_LATE_MUTANTS` for 0.5.21 and 0.5.22, the same design as released later. The PR-era campaigns run `--semantics pr` without the gates that arrived later
(`LATER_GATES`: a PR-era release publishes under them, which is reported apart); 0.5.23's without HiSparse, whose
sparse prefill every release gets wrong (`KNOWN_BUG_PATHS`: HiSparse's dense prefill, decode and eviction stay
drawn). The package is linked into a
scratch folder, the one file is rewritten there, and `python -m harness run --target sglang` runs with that
copy first on the path. Prints a table and writes JSON; exit 1 if a mutant survives or the clean copy is
flagged.

    python benchmarks/sglang_source_mutants.py [--examples N] [--device cpu|cuda] [--only A,B] [--no-seeds] [--out FILE]
    python benchmarks/sglang_source_mutants.py --only A --replay ARGS...

A row's finding replays only against the mutated copy: `replay` in its JSON is the command
`sglang_source_mutants.py --only NAME --replay ...`, which applies that one edit and runs `python -m harness
replay ...` (the harness's arguments after `--replay`) on the copy, exiting with the replay's code.

`--no-seeds` runs every campaign without the hand-written seed cases, so the table measures what the
fuzzer draws.

On 0.5.19 to 0.5.21 (`DRAFT_EXTEND_GRAPH_RACE`) EAGLE's draft-extend graph runner publishes read-done before its
replay, whose in-graph metadata step reads the Full-to-SWA mapping after it: a race of the released code that any
campaign finds within a few cases (BENCHMARKS section 25), so an unmutated copy is never clean there. Every campaign
of those releases runs as a server deployed around it does, with `SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH=1` (the
draft extend runs eagerly through SGLang's draft runner); no row of their tables edits that runner.

Needs sglang importable in this environment: 0.5.23 (the CI's `.venv-sglang`), or another release in its folder
first on PYTHONPATH over it (0.5.22 alone; 0.5.21, 0.5.20 or 0.5.19 with requirements-cpu-pr.txt; README).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

from harness.case import Flags
from harness.sglang_target.generations import RELEASED

BACKEND = "srt/layers/attention/deepseek_v4_backend.py"
BASE = "srt/layers/attention/base_attn_backend.py"
PUBLISHER = "srt/model_executor/runner_utils/shared_read_event.py"
KERNELS = "kernels/ops/attention/dsv4/sparse_prefill_kernels.py"
GRAPH_RUNNER = "srt/model_executor/runner/prefill_cuda_graph_runner.py"
BASE_GRAPH_RUNNER = "srt/model_executor/runner/base_cuda_graph_runner.py"
EAGER_RUNNER = "srt/model_executor/runner/eager_runner.py"
SCHEDULER = "srt/managers/scheduler.py"
BUFFER_REGISTRY = "srt/model_executor/cuda_graph_buffer_registry.py"
METADATA_KERNEL = "kernels/ops/attention/dsv4/metadata_kernel.py"
DRAFT_GRAPH_RUNNER = "srt/speculative/eagle_draft_extend_cuda_graph_runner.py"
POOL = "srt/mem_cache/deepseek_v4_memory_pool.py"
EAGLE_WORKER = "srt/speculative/eagle_worker_v2.py"
SPARSE_PREFILL_UTILS = "srt/layers/attention/dsv4/sparse_prefill_utils.py"
CP_INTERLEAVE = "srt/layers/cp/interleave.py"


@dataclass(frozen=True)
class SourceMutant:
    name: str
    file: str
    old: str
    new: str
    description: str
    also: tuple[tuple[str, str], ...] = ()  # further edits of the same file, for a change of two places
    # Why no run of this release's DSV4 prefill path can reach the edit (then the row is listed, not run); empty:
    # reachable, and run.
    unreachable: str = ""
    # Why the edit changes nothing a run of the path produces (a cost, not a wrong result: no oracle can judge it);
    # then the row is listed, not run. Empty: it changes a result.
    equivalent: str = ""

    @property
    def not_run(self) -> tuple[str, str]:
        """(outcome, reason) of a row listed and not run (one of `NOT_RUN`); ("", "") for a row the campaigns run."""
        for outcome, reason in zip(NOT_RUN, (self.unreachable, self.equivalent)):
            if reason:
                return outcome, reason
        return "", ""

    @property
    def edits(self) -> tuple[tuple[str, str], ...]:
        return ((self.old, self.new),) + self.also


# The outcomes of a row listed with its reason and never run, by the field that gives the reason.
NOT_RUN = ("UNREACHABLE", "EQUIVALENT")
# Rows of the 0.5.23 table whose edit no DSV4 prefill run of that release reaches (0.5.22 removed the tc_piecewise
# prefill backend, and DSV4's breakable graph replays its captured metadata): listed with the reason, not run.
UNREACHABLE_FRESH = ("the runner's fresh-metadata branch (`not self.use_captured_attn_metadata`): DSV4 sets "
                     "use_captured_forward_metadata_for_breakable_cuda_graph, and tc_piecewise was removed in 0.5.22")
# A bigger bucket than needed: every release's DSV4 attention op slices the bucket to the live rows
# (`num_token_non_padded`), padded rows write the dummy slot and read the padding request's row, and the output is
# trimmed to the live rows; the draft-extend runner drops its padded requests the same way.
EQUIVALENT_BIGGER_BUCKET = ("the live rows' outputs, KV and plans are those of the right bucket: DSV4's attention op "
                            "slices the bucket to the live token count and the runner trims to it, padded rows write "
                            "the dummy slot (more padding costs time, it changes no result; before the op ran, the "
                            "harness compared the padded rows and found it there)")
# PR-era rows (0.5.19 to 0.5.22) whose edit only a tc_piecewise replay of DSV4 reached: no release replays DSV4's
# prefill graph so (`SglangApi.graph_contracts`), and its breakable replay takes the captured metadata.
UNREACHABLE_PR_FRESH = ("the runner's fresh-metadata branch (`not self.use_captured_attn_metadata`): every PR-era "
                        "DSV4 backend sets use_captured_forward_metadata_for_breakable_cuda_graph, and the releases "
                        "that offer tc_piecewise turn it off for DSV4 (piecewise_cuda_graph_disabled_model_archs)")
UNREACHABLE_BCG_READ_END = ("DSV4's breakable replay resolves with build_snapshot=False, which returns "
                            "shared_read_ends(EXTEND) and never reads num_qo_tokens")
UNREACHABLE_COPY_CACHE = ("DSV4Metadata.copy_ runs only for decode, verify and draft-extend graph replays "
                          "(replay_cuda_graph_metadata_from), whose metadata never holds a sparse-prefill chunk cache")
UNREACHABLE_EAGLE_MAILBOX = ("no driven path of an EAGLE-family case publishes, so both mailboxes stay empty and the "
                             "barrier is coarse whichever it asks: the target's EXTEND is gated by the spec "
                             "(supports_prefill_shared_read_done), an eager verify or draft extend is not EXTEND, the "
                             "draft-extend graph's declaration is UNKNOWN; only the target's verify replayed by the "
                             "decode graph runner publishes (POST_REPLAY), and this harness does not drive that runner")
UNREACHABLE_PADDED_QUERY_ROWS = ("the combine kernel sees padded query rows only where the chunk cache is built over more rows "
                                 "than the extend has: never on a driven path (an eager batch is not padded, a breakable "
                                 "replay's attention op slices the bucket to the live rows before the forward builds the "
                                 "cache, sparse prefill is off under CP and a late-layer tail); only an eager batch that "
                                 "DP attention pads to its ranks' longest (MAX_LEN: pplx or DeepEP-v2 all-to-all) is, and "
                                 "this harness runs one DP rank")
UNREACHABLE_COPY_DECODE = ("DSV4AttnMetadata.copy_ runs only for decode, verify and draft-extend graph replays "
                           "(replay_cuda_graph_metadata_from): the decode graph runner, which this harness does not "
                           "drive, and the draft-extend one, whose SWA-only plan (need_compress=False) has no c4_out_loc")


MUTANTS = (
    SourceMutant("publish_any_read_end", PUBLISHER,
                 "    if shared_read_ends is not SharedReadEnds.PRE_REPLAY:\n        return\n", "",
                 "the publisher records read-done whatever the resolved read end"),
    SourceMutant("publish_for_any_spec", PUBLISHER,
                 "    if not model_runner.spec_algorithm.supports_prefill_shared_read_done():\n        return\n", "",
                 "the publisher ignores the spec algorithm's gate (a later draft reader)"),
    SourceMutant("publish_despite_offload", PUBLISHER,
                 "    if (\n        memory.enable_hierarchical_cache", "    if False and (\n        memory.enable_hierarchical_cache",
                 "the publisher ignores host / storage offload"),
    SourceMutant("snapshot_step_deleted", BACKEND,
                 "            metadata.sparse_prefill_cache = self._build_sparse_prefill_chunk_cache(\n"
                 "                forward_batch, metadata.core_attn_metadata, num_qo_tokens=num_qo_tokens\n"
                 "            )\n", "            pass\n",
                 "the snapshot hook no longer builds the sparse-prefill chunk cache, yet returns PRE_REPLAY"),
    SourceMutant("copy_keeps_cache", BACKEND,
                 "        )\n        self.sparse_prefill_cache = None\n\n    def refresh_for_breakable_cuda_graph_replay_(",
                 "        )\n\n    def refresh_for_breakable_cuda_graph_replay_(",
                 "DSV4Metadata.copy_ (graph metadata reused) keeps the previous batch's chunk cache",
                 unreachable=UNREACHABLE_COPY_CACHE),
    SourceMutant("refresh_keeps_cache", BACKEND,
                 "                src=static_metadata.c128_compress_metadata,\n            )\n"
                 "        self.sparse_prefill_cache = None\n",
                 "                src=static_metadata.c128_compress_metadata,\n            )\n",
                 "the breakable-graph refresh keeps the previous replay's chunk cache"),
    SourceMutant("cp_gate_deleted", BACKEND,
                 "        if is_cp_active(forward_batch):\n            return SharedReadEnds.UNKNOWN\n        # HiSparse",
                 "        # HiSparse",
                 "context parallelism takes the global snapshot path"),
    SourceMutant("hisparse_gate_deleted", BACKEND,
                 "        if self.hisparse_coordinator is not None:\n            return SharedReadEnds.UNKNOWN\n", "",
                 "HiSparse (per-layer translation after the snapshot) resolves PRE_REPLAY"),
    SourceMutant("hisparse_pool_store_untranslated", POOL,
                 "        freqs_cis: Optional[torch.Tensor] = None,\n    ) -> None:\n"
                 "        loc = self.translate_loc_to_hisparse_device(loc)\n"
                 "        return super().set_key_buffer_fused(layer_id, loc, cache_k, freqs_cis)\n",
                 "        freqs_cis: Optional[torch.Tensor] = None,\n    ) -> None:\n"
                 "        return super().set_key_buffer_fused(layer_id, loc, cache_k, freqs_cis)\n",
                 "HiSparse's c4 pool stores a compressed block at its logical slot, not at the device slot its readers "
                 "translate to (`HiSparseC4DevicePool.set_key_buffer_fused`)"),
    SourceMutant("query_pos_off_by_one", BACKEND,
                 "        query_pos = core_attn_metadata.seq_lens_casual[:num_qo_tokens] - 1\n",
                 "        query_pos = core_attn_metadata.seq_lens_casual[:num_qo_tokens] - 2\n",
                 "the chunk cache's query positions are one too low"),
    SourceMutant("threshold_inclusive", BACKEND,
                 "                num_qo_tokens > _LARGE_INDEXER_QUERY_THRESHOLD\n",
                 "                num_qo_tokens >= _LARGE_INDEXER_QUERY_THRESHOLD\n",
                 "sparse prefill also at exactly the indexer threshold"),
    SourceMutant("verify_reads_pre_replay", BACKEND,
                 "            return SharedReadEnds.POST_REPLAY\n        return super().shared_read_ends(fm)",
                 "            return SharedReadEnds.PRE_REPLAY\n        return super().shared_read_ends(fm)",
                 "target-verify declares its reads done before the replay"),
    SourceMutant("token_to_kv_pool_unassigned", BACKEND,
                 "        self.token_to_kv_pool: DeepSeekV4TokenToKVPool = model_runner.token_to_kv_pool\n", "",
                 "the backend never assigns token_to_kv_pool (the break after PR #35947)"),
    SourceMutant("coarse_flag_ignored", BASE,
                 "            envs.SGLANG_FORCE_COARSE_WAR_BARRIER.get()\n            or not envs.SGLANG_ENABLE_PREFILL_WAR_READ_DONE.get()\n",
                 "            False\n",
                 "the fast path ignores SGLANG_FORCE_COARSE_WAR_BARRIER and SGLANG_ENABLE_PREFILL_WAR_READ_DONE"),
    SourceMutant("any_mode_snapshots", BASE,
                 "        if forward_batch.forward_mode != ForwardMode.EXTEND:\n            return SharedReadEnds.UNKNOWN\n", "",
                 "every forward mode (MIXED, verify, ...) resolves through the snapshot"),
    SourceMutant("replay_skips_snapshot", GRAPH_RUNNER,
                 "                attn_backend.init_forward_metadata(forward_batch)\n                build_snapshot = True\n",
                 "                attn_backend.init_forward_metadata(forward_batch)\n",
                 "graph replay never builds the snapshot (the fast path is lost)",
                 unreachable=UNREACHABLE_FRESH),
    SourceMutant("swa_gather_shifted", KERNELS,
                 "        pos = first_pos + i\n", "        pos = first_pos + i + 1\n",
                 "the Triton SWA gather reads each window one position late"),
    SourceMutant("window_drops_current_token", KERNELS,
                 "        swa_len = tl.where(owned, tl.minimum(pos + 1, WINDOW_SIZE), 0)\n",
                 "        swa_len = tl.where(owned, tl.minimum(pos, WINDOW_SIZE), 0)\n",
                 "the combined rows' window leaves out the query's own token"),
    SourceMutant("topk_len_off_by_one", KERNELS,
                 "    topk_len = tl.where(owned, tl.minimum((pos + 1) // COMPRESS_RATIO, top_k), 0)\n",
                 "    topk_len = tl.where(owned, tl.minimum(pos // COMPRESS_RATIO, top_k), 0)\n",
                 "a query sees one compressed block too few when its position closes a block"),
    SourceMutant("topk_holes_filled", KERNELS,
                 "        tl.where(topk_vals >= 0, topk_vals + compressed_base[:, None], -1),\n",
                 "        topk_vals + compressed_base[:, None],\n",
                 "-1 holes in the top-k span become real indices (compressed_base - 1)"),
    SourceMutant("padding_rows_owned", KERNELS,
                 "    owned = valid & (token < tl.load(query_start_loc_ptr + num_reqs) - base)\n",
                 "    owned = valid\n",
                 "rows past the last request's queries (padding) get index rows of the last request",
                 unreachable=UNREACHABLE_PADDED_QUERY_ROWS),
    SourceMutant("bucket_bisect_right", BASE_GRAPH_RUNNER,
                 "        index = bisect.bisect_left(buckets, raw_size)\n",
                 "        index = min(bisect.bisect_right(buckets, raw_size), len(buckets) - 1)\n",
                 "a token count equal to a bucket pads to the next bucket",
                 equivalent=EQUIVALENT_BIGGER_BUCKET),
    # -- the eager runner, the scheduler's loop and barrier, the metadata's field lists (issue: real runners)
    SourceMutant("eager_mixed_kept_mixed", EAGER_RUNNER,
                 "            if mode.is_mixed() and not is_npu() and get_cp_strategy() is None:\n",
                 "            if False and mode.is_mixed() and not is_npu() and get_cp_strategy() is None:\n",
                 "EagerRunner.execute no longer runs a mixed batch as EXTEND (its prefill loses the fast path)"),
    SourceMutant("eager_init_condition_inverted", EAGER_RUNNER,
                 "            forward_batch.needs_forward_metadata_init()\n            or cp_active\n",
                 "            not forward_batch.needs_forward_metadata_init()\n            or cp_active\n",
                 "_execute_extend plans metadata (and resolves, publishes) only for batches already planned"),
    SourceMutant("eager_snapshot_at_request_count", EAGER_RUNNER,
                 "                    num_qo_tokens=len(forward_batch.input_ids),\n",
                 "                    num_qo_tokens=forward_batch.batch_size,\n",
                 "the eager runner resolves the snapshot for the request count, not the query rows"),
    SourceMutant("eager_event_module_of_host", EAGER_RUNNER,
                 "                torch.get_device_module(model_runner.device),\n",
                 "                torch.get_device_module(\"cpu\"),\n",
                 "the eager runner publishes through the host's device module (an event that orders nothing)"),
    SourceMutant("event_recorded_on_new_stream", PUBLISHER,
                 "    read_done.record()\n", "    read_done.record(device_module.Stream())\n",
                 "the read-done event is recorded on a fresh stream, not the forward stream"),
    SourceMutant("barrier_enabled_on_hip_only", SCHEDULER,
                 "        self._war_barrier_enabled = is_cuda() or envs.SGLANG_ENABLE_WAR_BARRIER.get()\n",
                 "        self._war_barrier_enabled = _is_hip or envs.SGLANG_ENABLE_WAR_BARRIER.get()\n",
                 "the WAR barrier's enabling checks the wrong platform: off on CUDA (R21's class, #36054)"),
    SourceMutant("barrier_keeps_event", SCHEDULER,
                 "        ev = runner.shared_read_done_event\n        runner.shared_read_done_event = None\n",
                 "        ev = runner.shared_read_done_event\n",
                 "_apply_war_barrier leaves the event in the mailbox: a later batch that did not publish waits on it"),
    SourceMutant("barrier_before_launch", SCHEDULER,
                 "                batch_result = self.run_batch(batch)\n"
                 "                # Fence result processing behind this forward's shared reads.\n"
                 "                self._apply_war_barrier()\n",
                 "                # Fence result processing behind this forward's shared reads.\n"
                 "                self._apply_war_barrier()\n"
                 "                batch_result = self.run_batch(batch)\n",
                 "the overlap loop fences before run_batch, as before #31687 (R9): result processing overtakes the forward"),
    # -- a lost fast path no value shows (issue 30): the `fast-path` oracle's
    SourceMutant("barrier_waits_forward_after_publish", SCHEDULER,
                 "            self.schedule_stream.wait_event(ev)\n",
                 "            self.schedule_stream.wait_event(ev)\n"
                 "            self.schedule_stream.wait_stream(self.forward_stream)\n",
                 "_apply_war_barrier waits on the event, then on the whole forward stream as well"),
    SourceMutant("barrier_ignores_event", SCHEDULER,
                 "        if ev is not None and not envs.SGLANG_FORCE_COARSE_WAR_BARRIER.get():\n",
                 "        if False and ev is not None and not envs.SGLANG_FORCE_COARSE_WAR_BARRIER.get():\n",
                 "_apply_war_barrier clears the published event and always takes the coarse barrier"),
    SourceMutant("event_after_layers", EAGER_RUNNER,
                 "            maybe_publish_prefill_shared_read_done(\n                model_runner,\n"
                 "                shared_read_ends,\n                torch.get_device_module(model_runner.device),\n"
                 "            )\n\n        if not cp_active:\n",
                 "            self._late_publish = shared_read_ends\n\n        if not cp_active:\n",
                 "the eager runner records the read-done event after the model's forward (it fires with the layers)",
                 also=(("                    **kwargs,\n                )\n        return ret\n",
                        "                    **kwargs,\n                )\n"
                        "        if getattr(self, \"_late_publish\", None) is not None:\n"
                        "            maybe_publish_prefill_shared_read_done(\n"
                        "                model_runner, self._late_publish, torch.get_device_module(model_runner.device)\n"
                        "            )\n"
                        "            self._late_publish = None\n"
                        "        return ret\n"),)),
    # -- stale state across steps (issue 30): the `freshness` oracle's
    SourceMutant("idle_keeps_metadata", EAGER_RUNNER,
                 "            model_runner.attn_backend.forward_metadata = None\n", "            pass\n",
                 "EagerRunner._execute_idle no longer drops the previous batch's metadata: the idle step's forward runs "
                 "with it (SGLang's comment: an SWA use-after-free on req_pool)"),
    SourceMutant("copy_assigns_c4_out_loc", BACKEND,
                 '"positions_casual",\n                "c4_out_loc",\n                "c128_out_loc",\n',
                 '"positions_casual",\n                "c128_out_loc",\n',
                 "DSV4AttnMetadata.copy_ re-binds c4_out_loc, which captured kernels read by address (R18's class)",
                 also=(('                "swa_out_cache_loc",\n                "c0_flashmla_metadata",\n',
                        '                "swa_out_cache_loc",\n                "c4_out_loc",\n'
                        '                "c0_flashmla_metadata",\n'),),
                 unreachable=UNREACHABLE_COPY_DECODE),
    SourceMutant("refresh_assigns_c4_out_loc", BACKEND,
                 '"positions_casual",\n            "c4_out_loc",\n            "c128_out_loc",\n',
                 '"positions_casual",\n            "c128_out_loc",\n',
                 "the breakable-graph refresh re-binds c4_out_loc instead of copying into the captured tensor",
                 also=(('        reference_assign_fields = [\n            "page_table",\n',
                        '        reference_assign_fields = [\n            "c4_out_loc",\n            "page_table",\n'),)),
    SourceMutant("late_live_mapping_check", BACKEND,
                 "        if cached is not None and cached.shape[0] == out_cache_loc.shape[0]:\n            return cached\n",
                 "        if cached is not None and cached.shape[0] == out_cache_loc.shape[0]:\n"
                 "            # Sanity check: the snapshot's slots are still mapped.\n"
                 "            assert bool((self.token_to_kv_pool.full_to_swa_index_mapping[out_cache_loc] >= -1).all())\n"
                 "            return cached\n",
                 "a per-layer sanity check reads the live Full-to-SWA mapping after read-done (it changes no value: "
                 "only the observed tracker can see it)"),
    # -- the prefill graph runner's load_batch, its static-buffer registry and the output's trim
    SourceMutant("registry_out_cache_loc_keeps_pad", BUFFER_REGISTRY,
                 "            padding_policy=PaddingPolicy.ZERO,\n        ),\n    ]\n    if register_input_embeds is None:",
                 "            padding_policy=PaddingPolicy.KEEP_PAD,\n        ),\n    ]\n    if register_input_embeds is None:",
                 "the prefill registry keeps out_cache_loc's padded rows from the last replay instead of the dummy slot 0"),
    SourceMutant("load_batch_pads_nothing", GRAPH_RUNNER,
                 "            raw_num_tokens=num_tokens,\n            padded_num_tokens=static_num_tokens,\n",
                 "            raw_num_tokens=num_tokens,\n            padded_num_tokens=num_tokens,\n",
                 "load_batch fills the static buffers for the live rows only: the bucket's padded rows keep stale values"),
    SourceMutant("trim_keeps_padded_rows", GRAPH_RUNNER,
                 "                output.hidden_states[: self.raw_num_tokens]\n",
                 "                output.hidden_states\n",
                 "a replay's output is not trimmed to the live rows (the padded rows come back as tokens)"),
    SourceMutant("replay_snapshot_at_live_count", GRAPH_RUNNER,
                 "            num_qo_tokens=shape_key.size,\n            build_snapshot=build_snapshot,\n",
                 "            num_qo_tokens=len(forward_batch.input_ids),\n            build_snapshot=build_snapshot,\n",
                 "graph replay snapshots at the live token count, not the padded bucket the replay runs",
                 unreachable=UNREACHABLE_BCG_READ_END),
    # -- the backend's own metadata init and forward (issue 27: run for real on an eager EXTEND batch)
    SourceMutant("prefill_sparse_always_lazy", BACKEND,
                 "        q_flat = q.squeeze(1)\n\n        cache = self.forward_metadata.sparse_prefill_cache\n",
                 "        q_flat = q.squeeze(1)\n\n        cache = None  # rebuilt from the tables by every layer\n",
                 "_forward_prefill_sparse ignores the resolver's snapshot and builds the chunk cache lazily in every "
                 "layer, from the live tables, after read-done"),
    SourceMutant("swa_loc_translated_per_layer", BACKEND,
                 "        if cached is not None and cached.shape[0] == out_cache_loc.shape[0]:\n            return cached\n",
                 "",
                 "get_swa_out_cache_loc translates the write locations through the live Full-to-SWA mapping in every "
                 "layer, after read-done, instead of taking init's snapshot"),
    SourceMutant("init_skips_swa_write_snapshot", BACKEND,
                 "                metadata.core_attn_metadata.swa_out_cache_loc = (\n"
                 "                    self.token_to_kv_pool.translate_loc_from_full_to_swa(\n"
                 "                        out_cache_loc\n                    ).to(torch.int32)\n                )\n",
                 "                pass\n",
                 "metadata init no longer snapshots the SWA write locations, so every layer's store translates them "
                 "through the live mapping after read-done"),
    SourceMutant("store_at_full_slots", BACKEND,
                 "        swa_loc = self.get_swa_out_cache_loc(forward_batch)\n"
                 "        self.token_to_kv_pool.set_swa_key_buffer_radix_fused(\n",
                 "        swa_loc = forward_batch.out_cache_loc\n"
                 "        self.token_to_kv_pool.set_swa_key_buffer_radix_fused(\n",
                 "store_cache writes the SWA latents at the full slots, not the SWA slots they map to"),
    SourceMutant("c4_visible_blocks_off_by_one", METADATA_KERNEL,
                 "    c4_seq_lens_raw = seq_len // 4\n", "    c4_seq_lens_raw = (seq_len - 1) // 4\n",
                 "metadata init plans one c4 block too few for a query whose position closes a block (the indexer "
                 "never chooses it)"),
    # -- the verify and decode metadata (issue 27: an eager TARGET_VERIFY batch runs SGLang's ragged verify planning,
    # a DECODE batch its decode planning, each with the real forward)
    SourceMutant("verify_seq_lens_not_extended", BACKEND,
                 "        if is_ragged:\n            seq_lens = seq_lens + extend_seq_lens\n",
                 "        if is_ragged:\n            seq_lens = seq_lens\n",
                 "the ragged verify plan forgets to add the verify lengths to the committed lengths: each verify "
                 "token attends as if the draft tokens before it were not there"),
    SourceMutant("verify_lens_not_staged", BACKEND,
                 "            self.extend_seq_lens_buffer[:bs].copy_(ragged_layout.verify_lens)\n", "",
                 "target-verify metadata init no longer copies the layout's verify lengths into the backend's reused "
                 "buffer: the plan reads the lengths it held (the server's draft width, or the last verify batch's)"),
    SourceMutant("verify_compressor_plans_decode", BACKEND,
                 "            is_prefill=True,\n            token_to_kv_pool=self.token_to_kv_pool,\n"
                 "            req_to_token=self.req_to_token,\n            req_pool_indices=req_pool_indices,\n"
                 "            seq_lens=seq_lens,\n            extend_lens=extend_seq_lens,\n",
                 "            is_prefill=False,\n            token_to_kv_pool=self.token_to_kv_pool,\n"
                 "            req_to_token=self.req_to_token,\n            req_pool_indices=req_pool_indices,\n"
                 "            seq_lens=seq_lens,\n            extend_lens=extend_seq_lens,\n",
                 "the verify metadata plans the compressors as for a decode step (one token a request): the blocks "
                 "the other verify tokens complete are not stored"),
    SourceMutant("decode_excludes_own_token", BACKEND,
                 "            req_pool_indices_repeated=req_pool_indices,\n            seq_lens_casual=seq_lens,\n",
                 "            req_pool_indices_repeated=req_pool_indices,\n            seq_lens_casual=seq_lens - 1,\n",
                 "the decode metadata plans each request's attention one token short: the new token does not see "
                 "itself (its SWA window ends a token early)"),
    # -- the breakable graph's captured metadata and its replay refresh (issue 27: SGLang captures the bucket and
    # refreshes it; the captured segments read the capture's tensors)
    SourceMutant("refresh_assigns_compress_plan", BACKEND,
                 "        maybe_copy_inplace(\n"
                 "            self.c4_compress_metadata, src=static_metadata.c4_compress_metadata\n        )\n",
                 "        self.c4_compress_metadata = static_metadata.c4_compress_metadata\n",
                 "the breakable-graph refresh re-binds the c4 compressor plan instead of copying it into the captured "
                 "one: the captured compressor stores by the capture's plan"),
    SourceMutant("refresh_rebinds_c4_sparse_indices", BACKEND,
                 '        reference_assign_fields = [\n            "page_table",\n',
                 '        reference_assign_fields = [\n            "c4_sparse_page_indices",\n            "page_table",\n',
                 "the breakable-graph refresh re-binds the c4 sparse indices: the attention reads the fresh plan's "
                 "tensor, which the captured indexer never fills"),
    SourceMutant("refresh_skips_swa_loc_retranslate", BACKEND,
                 "        capture_metadata.refresh_for_breakable_cuda_graph_replay_(static_metadata)\n"
                 "        if self._prefill_graph_translates_swa_loc(static_metadata):\n",
                 "        capture_metadata.refresh_for_breakable_cuda_graph_replay_(static_metadata)\n"
                 "        if False:\n",
                 "the breakable-graph replay prep no longer re-translates the SWA write locations into the captured "
                 "metadata: every layer stores at the last replay's slots"),
    # -- EAGLE's draft extend after a verify, replayed by its CUDA graph runner (its in-graph metadata step re-reads
    # the Full-to-SWA mapping during the replay)
    SourceMutant("draft_extend_publishes_before_replay", DRAFT_GRAPH_RUNNER,
                 "        if shared_read_ends is SharedReadEnds.PRE_REPLAY:\n            self._publish_read_done(in_graph=False)\n",
                 "        if True:\n            self._publish_read_done(in_graph=False)\n",
                 "the draft-extend graph runner publishes read-done before its replay, whatever the backend declares "
                 "(0.5.19 to 0.5.21's code): the replay's in-graph metadata step reads the mapping after the event"),
    SourceMutant("draft_extend_declared_pre_replay", BACKEND,
                 "        if fm.is_target_verify():\n            if self.model_runner.spec_algorithm.is_dspark():\n",
                 "        if fm.is_draft_extend_v2():\n            return SharedReadEnds.PRE_REPLAY\n"
                 "        if fm.is_target_verify():\n            if self.model_runner.spec_algorithm.is_dspark():\n",
                 "the backend declares its draft-extend reads over before the replay (PRE_REPLAY), though its "
                 "in-graph metadata step translates the write locations through the live mapping"),
    SourceMutant("draft_extend_padding_keeps_pool_rows", DRAFT_GRAPH_RUNNER,
                 "            buffers.req_pool_indices.zero_()\n", "",
                 "a padded draft-extend bucket keeps the request-pool rows an earlier, larger batch left in the static "
                 "buffer instead of pointing its padded requests at the reserved slot 0: the metadata plan reads "
                 "another request's row of req_to_token, which the scheduler may be rewriting"),
    SourceMutant("draft_extend_padding_keeps_out_cache_loc", DRAFT_GRAPH_RUNNER,
                 "            buffers.out_cache_loc.zero_()\n", "",
                 "a padded draft-extend bucket keeps the output slots an earlier, larger batch left in the static "
                 "buffer instead of the dummy slot 0: the graph's padded tokens store their latents into that "
                 "batch's KV slots"),
    # -- session 33: regressions no hand-written case was written for, in the worker's wiring, the compressed plan
    # and the chunk cache's sizing
    SourceMutant("eagle_last_reader_is_target", EAGLE_WORKER,
                 "        return self._draft_worker.draft_runner\n",
                 "        return self._target_worker.model_runner\n",
                 "EAGLEWorkerV2.last_shared_read_runner names the target runner though the draft extend, the step's "
                 "last shared-table reader, runs on the draft runner: the barrier asks the wrong mailbox",
                 unreachable=UNREACHABLE_EAGLE_MAILBOX),
    SourceMutant("c128_compresses_a_token_late", METADATA_KERNEL,
                 "    c128_should_compress = (seq_len % 128) == 0\n",
                 "    c128_should_compress = (seq_len % 128) == 1\n",
                 "metadata init plans a c128 block's store at the token after the one that closes it"),
    SourceMutant("chunk_cache_sized_by_extend", BACKEND,
                 "            max_seq_len=max(seq_lens_cpu_list),\n",
                 "            max_seq_len=max(extend_seq_lens_cpu),\n",
                 "the sparse-prefill chunk cache sizes its compressed gather by the longest extend, not the longest "
                 "sequence: a request's compressed prefix past that width is left out"),
    # -- session 34: the chunk cache's compressed gather, per request
    SourceMutant("compressed_gather_next_request_pages", SPARSE_PREFILL_UTILS,
                 "            self.query_start_loc[:-1].clamp_max(self.num_qo_tokens - 1).long()\n",
                 "            self.query_start_loc[1:].clamp_max(self.num_qo_tokens - 1).long()\n",
                 "the chunk cache gathers each request's compressed history through the page-table row of the next "
                 "request's first query (the last request's own last row)"),
    SourceMutant("compressed_gather_drops_closed_block", SPARSE_PREFILL_UTILS,
                 "        lengths_cpu = [int(length) // compress_ratio for length in seq_lens_cpu]\n",
                 "        lengths_cpu = [(int(length) - 1) // compress_ratio for length in seq_lens_cpu]\n",
                 "the chunk cache's compressed gather leaves out the block the request's last token closes"),
    # -- session 35: context parallelism, each rank's plan and forward now SGLang's own (0.5.23 runs CP)
    SourceMutant("cp_reindex_keeps_swa_pages", BACKEND,
                 '        "positions_casual",\n        "swa_page_indices",\n',
                 '        "positions_casual",\n',
                 "a CP rank keeps the whole batch's SWA page indices: its query rows read the windows of the "
                 "batch's first rows"),
    SourceMutant("cp_reindex_keeps_c128_pages", BACKEND,
                 '        "c4_topk_lengths_clamp1",\n        "c128_page_indices",\n',
                 '        "c4_topk_lengths_clamp1",\n',
                 "a CP rank keeps the whole batch's c128 page indices: its query rows read the c128 blocks of the "
                 "batch's first rows"),
    SourceMutant("cp_causal_metadata_unpadded", BACKEND,
                 "            padded_num_tokens = sum(cp_metadata.per_rank_actual_token)\n", "",
                 "CP's causal metadata is planned over the live tokens, not padded to the ranks' equal shares"),
    SourceMutant("sparse_prefill_under_cp", BACKEND,
                 "            and not is_cp_active(forward_batch)\n            and not get_platform().is_sm120\n",
                 "            and not get_platform().is_sm120\n",
                 "a CP rank takes sparse prefill: its chunk cache is built over the whole batch's rows"),
    # -- session 36: SGLang's own `can_apply` decides which batches CP shards (a batch of fewer tokens than ranks runs
    # whole, as without CP); the gates that must ask it of the batch, not of the server
    SourceMutant("cp_shards_below_the_rank_count", CP_INTERLEAVE,
                 "        return seq_len > 0 and seq_len >= cp_size and cp_size > 1\n",
                 "        return seq_len > 0 and cp_size > 1\n",
                 "the interleave strategy shards a batch of fewer tokens than CP ranks: a rank is left without a "
                 "token, and the batch no longer publishes"),
    SourceMutant("cp_plan_by_server", BACKEND,
                 "        cp_active = forward_batch is not None and is_cp_active(forward_batch)\n",
                 "        cp_active = forward_batch is not None and get_parallel().attn_cp_size > 1\n",
                 "the prefill plan asks whether the server runs CP, not whether CP shards this batch: a batch too "
                 "small to shard is planned as a rank's share"),
    SourceMutant("cp_snapshot_by_server", BACKEND,
                 "        if is_cp_active(forward_batch):\n            return SharedReadEnds.UNKNOWN\n",
                 "        if get_parallel().attn_cp_size > 1:\n            return SharedReadEnds.UNKNOWN\n",
                 "the snapshot gate asks whether the server runs CP, not whether CP shards this batch: a batch too "
                 "small to shard never publishes"),
)


SPARSE_UTILS = "srt/layers/attention/dsv4/sparse_prefill_utils.py"

# PR #35947's own design, as released in 0.5.19 (and 0.5.20): the hook, the flag on the metadata, the publisher
# that asks `shared_read_ends`, the runners that call the hook, the scheduler's barrier.
PR_ERA_MUTANTS = (
    SourceMutant("pr_hook_skips_build", BACKEND,
                 "            metadata.sparse_prefill_cache = self._build_sparse_prefill_chunk_cache(\n"
                 "                forward_batch, num_qo_tokens=num_qo_tokens\n            )\n",
                 "            pass\n",
                 "the hook marks the snapshot taken without building the chunk cache (the first sparse layer "
                 "builds it from the live tables after the event)"),
    SourceMutant("pr_flag_before_gate", BACKEND,
                 "        if not snapshot_shared_prefill_reads:\n            return\n",
                 "        if not snapshot_shared_prefill_reads:\n"
                 "            if isinstance(metadata, DSV4Metadata):\n"
                 "                metadata.prefill_shared_reads_snapshotted = True\n            return\n",
                 "the flag is set even where a gate closes the snapshot (no chunk cache is built)"),
    SourceMutant("pr_dflash_gate_dropped", BACKEND,
                 "            and self.model_runner.spec_algorithm.is_dflash_family()\n            and not is_cp",
                 "            and not is_cp",
                 "the hook snapshots for every spec algorithm, so plain and EAGLE prefill publish "
                 "(the PR's unit test: the DFLASH family publishes, EAGLE/MTP do not)"),
    SourceMutant("pr_threshold_inclusive", BACKEND,
                 "            num_qo_tokens > _LARGE_INDEXER_QUERY_THRESHOLD\n            or envs.SGLANG_OPT",
                 "            num_qo_tokens >= _LARGE_INDEXER_QUERY_THRESHOLD\n            or envs.SGLANG_OPT",
                 "the snapshot builds the chunk cache at exactly the threshold, where the forward runs dense "
                 "(the PR's unit test: threshold vs threshold + 1)"),
    SourceMutant("pr_read_ends_ignore_flag", BACKEND,
                 "            and isinstance(metadata, DSV4Metadata)\n"
                 "            and metadata.prefill_shared_reads_snapshotted\n",
                 "            and isinstance(metadata, DSV4Metadata)\n",
                 "shared_read_ends declares PRE_REPLAY for every EXTEND, snapshot or not"),
    SourceMutant("pr_copy_keeps_cache", BACKEND,
                 "            self.c128_compress_metadata, src=other.c128_compress_metadata\n        )\n"
                 "        self.sparse_prefill_cache = None\n",
                 "            self.c128_compress_metadata, src=other.c128_compress_metadata\n        )\n",
                 "DSV4Metadata.copy_ (a graph bucket's metadata reused) keeps the previous batch's chunk cache",
                 unreachable=UNREACHABLE_COPY_CACHE),
    SourceMutant("pr_refresh_keeps_cache", BACKEND,
                 "                src=static_metadata.c128_compress_metadata,\n            )\n"
                 "        self.sparse_prefill_cache = None\n",
                 "                src=static_metadata.c128_compress_metadata,\n            )\n",
                 "the breakable-graph refresh keeps the previous replay's chunk cache"),
    SourceMutant("pr_publish_undeclared", PUBLISHER,
                 "    if declared is not SharedReadEnds.PRE_REPLAY:\n        return\n", "",
                 "the publisher records read-done whatever the backend declares"),
    SourceMutant("pr_event_on_new_stream", PUBLISHER,
                 "    read_done.record()\n", "    read_done.record(device_module.Stream())\n",
                 "the read-done event is recorded on a fresh stream, not the forward stream"),
    SourceMutant("pr_eager_snapshot_at_request_count", EAGER_RUNNER,
                 "                num_qo_tokens=len(forward_batch.input_ids),\n",
                 "                num_qo_tokens=forward_batch.batch_size,\n",
                 "the eager runner snapshots for the request count, not the query rows"),
    SourceMutant("pr_eager_mixed_kept_mixed", EAGER_RUNNER,
                 "        if mode.is_mixed() and not is_npu() and get_cp_strategy() is None:\n",
                 "        if False and mode.is_mixed() and not is_npu() and get_cp_strategy() is None:\n",
                 "EagerRunner.execute no longer runs a mixed batch as EXTEND (its prefill loses the fast path)"),
    SourceMutant("pr_replay_snapshot_at_live_count", GRAPH_RUNNER,
                 "            attn_backend.prepare_prefill_shared_read_snapshot(\n"
                 "                forward_batch, num_qo_tokens=num_tokens\n",
                 "            attn_backend.prepare_prefill_shared_read_snapshot(\n"
                 "                forward_batch, num_qo_tokens=len(forward_batch.input_ids)\n",
                 "graph replay snapshots at the live token count, not the padded bucket it replays "
                 "(the PR's unit test: replay snapshots at the padded token count)",
                 unreachable=UNREACHABLE_PR_FRESH),
    SourceMutant("pr_replay_skips_snapshot", GRAPH_RUNNER,
                 "            attn_backend.init_forward_metadata(forward_batch)\n"
                 "            attn_backend.prepare_prefill_shared_read_snapshot(\n"
                 "                forward_batch, num_qo_tokens=num_tokens\n            )\n",
                 "            attn_backend.init_forward_metadata(forward_batch)\n",
                 "graph replay never calls the hook (the fast path is lost)",
                 unreachable=UNREACHABLE_PR_FRESH),
    SourceMutant("pr_barrier_keeps_event", SCHEDULER,
                 "        ev = runner.shared_read_done_event\n        runner.shared_read_done_event = None\n",
                 "        ev = runner.shared_read_done_event\n",
                 "_apply_war_barrier leaves the event in the mailbox: a later batch that did not publish waits on it"),
    SourceMutant("pr_barrier_enabled_on_hip_only", SCHEDULER,
                 "        self._war_barrier_enabled = is_cuda() or envs.SGLANG_ENABLE_WAR_BARRIER.get()\n",
                 "        self._war_barrier_enabled = _is_hip or envs.SGLANG_ENABLE_WAR_BARRIER.get()\n",
                 "the WAR barrier's enabling checks the wrong platform: off on CUDA (R21's class, #36054)"),
    SourceMutant("pr_barrier_before_launch", SCHEDULER,
                 "                batch_result = self.run_batch(batch)\n"
                 "                # Fence result processing behind this forward's shared reads.\n"
                 "                self._apply_war_barrier()\n",
                 "                # Fence result processing behind this forward's shared reads.\n"
                 "                self._apply_war_barrier()\n"
                 "                batch_result = self.run_batch(batch)\n",
                 "the overlap loop fences before run_batch (R9's class): result processing overtakes the forward"),
    SourceMutant("pr_swa_gather_shifted", KERNELS,
                 "        pos = first_pos + i\n", "        pos = first_pos + i + 1\n",
                 "the Triton SWA gather reads each window one position late"),
    SourceMutant("pr_window_drops_current_token", KERNELS,
                 "        swa_len = tl.minimum(pos + 1, WINDOW_SIZE)\n", "        swa_len = tl.minimum(pos, WINDOW_SIZE)\n",
                 "the combined rows' window leaves out the query's own token"),
)


def _rows(table: tuple[SourceMutant, ...], names: tuple[str, ...]) -> tuple[SourceMutant, ...]:
    """The rows of `table` named `names`, in that order (a name that is not there is this file's error)."""
    by_name = {m.name: m for m in table}
    return tuple(by_name[name] for name in names)


# PR #35947's design as released in 0.5.21 and 0.5.22, whose backend runs its own __init__, metadata init and
# forward (the `pr-late` generation): the rows of the two tables above whose edit is the same text in both
# releases, and the one whose text moved.
PR_LATE_MUTANTS = _rows(MUTANTS, (
    # the PR's hook, flag and refresh (0.5.23's rows: the same code, the build given the core metadata)
    "snapshot_step_deleted", "refresh_keeps_cache", "query_pos_off_by_one", "threshold_inclusive",
    "swa_gather_shifted",
    # the backend's own __init__, metadata init and forward, and the verify and decode plans
    "token_to_kv_pool_unassigned", "prefill_sparse_always_lazy", "init_skips_swa_write_snapshot",
    "store_at_full_slots", "c4_visible_blocks_off_by_one", "verify_seq_lens_not_extended", "verify_lens_not_staged",
    "verify_compressor_plans_decode", "decode_excludes_own_token",
    # the breakable graph: the bucket, load_batch, the refresh of the captured metadata, the trim
    "bucket_bisect_right", "load_batch_pads_nothing", "trim_keeps_padded_rows", "refresh_assigns_c4_out_loc",
    "refresh_assigns_compress_plan", "refresh_rebinds_c4_sparse_indices",
    # the eager runner, the publisher and the scheduler's barrier
    "eager_init_condition_inverted", "eager_event_module_of_host", "idle_keeps_metadata",
    "event_recorded_on_new_stream", "barrier_enabled_on_hip_only", "barrier_keeps_event", "barrier_before_launch",
    "barrier_waits_forward_after_publish", "barrier_ignores_event",
    # EAGLE's draft-extend graph runner (0.5.22 publishes from the backend's declaration, as 0.5.23)
    "draft_extend_publishes_before_replay", "draft_extend_declared_pre_replay", "draft_extend_padding_keeps_pool_rows",
    "draft_extend_padding_keeps_out_cache_loc",
    # the compressed plan and the chunk cache's sizing (session 33's rows; the same text in every release)
    "c128_compresses_a_token_late", "chunk_cache_sized_by_extend", "compressed_gather_next_request_pages",
)) + _rows(PR_ERA_MUTANTS, (
    "pr_flag_before_gate", "pr_dflash_gate_dropped", "pr_read_ends_ignore_flag", "pr_publish_undeclared",
    "pr_eager_snapshot_at_request_count", "pr_eager_mixed_kept_mixed",
)) + (
    SourceMutant("swa_loc_translated_per_layer", BACKEND,
                 "        if (\n            cached is not None\n            and not forward_batch.forward_mode.is_idle()\n"
                 "            and cached.shape[0] == out_cache_loc.shape[0]\n        ):\n            return cached\n",
                 "",
                 "get_swa_out_cache_loc translates the write locations through the live Full-to-SWA mapping in every "
                 "layer, after read-done, instead of taking init's snapshot"),
)
# PR #35947's design as first released in 0.5.19 and 0.5.20 (the `pr-early` generation), whose backend now runs its
# own __init__, metadata init and forward too: the PR-era rows, and the rows of the tables above whose edit is the
# same text in both releases (the ones the PR-era rows already carry under their own names left out).
PR_EARLY_MUTANTS = PR_ERA_MUTANTS + _rows(MUTANTS, (
    # the backend's own __init__, metadata init and forward, and the verify and decode plans
    "token_to_kv_pool_unassigned", "prefill_sparse_always_lazy", "store_at_full_slots", "c4_visible_blocks_off_by_one",
    "verify_seq_lens_not_extended", "verify_lens_not_staged", "verify_compressor_plans_decode",
    "decode_excludes_own_token", "c128_compresses_a_token_late", "chunk_cache_sized_by_extend",
    # the breakable graph: the bucket, load_batch, the refresh of the captured metadata, the trim
    "bucket_bisect_right", "load_batch_pads_nothing", "trim_keeps_padded_rows", "refresh_assigns_c4_out_loc",
    "refresh_assigns_compress_plan", "refresh_rebinds_c4_sparse_indices",
    # the eager runner, the idle step and the scheduler's barrier
    "eager_event_module_of_host", "idle_keeps_metadata", "barrier_waits_forward_after_publish", "barrier_ignores_event",
)) + _rows(PR_LATE_MUTANTS, ("swa_loc_translated_per_layer",))
TABLES = {"resolver": MUTANTS, "pr-late": PR_LATE_MUTANTS, "pr-early": PR_EARLY_MUTANTS}  # by the API generation
LATER_GATES = "hierarchical_cache,hicache_storage,lmcache,hisparse"
# A bug of every release (BENCHMARKS.md, section 31): with HiSparse, the sparse prefill gathers the c4 cache at the
# logical slots of its page table, where the compressor stored it at HiSparse device slots, so a HiSparse case whose
# blocks moved is a finding on the unmutated copy. The table's campaigns leave out that path, not the gate: a
# HiSparse case prefills dense (`--without hisparse_sparse_prefill`), so the rows that edit HiSparse's gate and its
# pool's translating store are found by the campaigns.
KNOWN_BUG_PATHS = Flags.HISPARSE_SPARSE_PREFILL
# The releases whose draft-extend graph publishes before its replay, and the server setting their campaigns run under.
DRAFT_EXTEND_GRAPH_RACE = ("0.5.19", "0.5.20", "0.5.21")
DRAFT_EXTEND_GRAPH_OFF = {"SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH": "1"}


def server_settings(installed: str) -> dict[str, str]:
    """The server settings every campaign of the installed release's table runs under (`DRAFT_EXTEND_GRAPH_RACE`)."""
    return dict(DRAFT_EXTEND_GRAPH_OFF) if installed in DRAFT_EXTEND_GRAPH_RACE else {}


def environment_broken(message: str) -> SystemExit:
    """The harness's exit code for an environment that cannot vouch (3), with the reason on stderr."""
    print(f"error: {message}", file=sys.stderr)
    return SystemExit(3)


def installed_sglang() -> Path:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise environment_broken("sglang is not installed in this environment (see "
                                 "harness/sglang_target/requirements-cpu.txt)")
    return Path(list(spec.submodule_search_locations)[0])


def installed_table() -> tuple[str, tuple[SourceMutant, ...]]:
    """The installed release's version and its table (by its API generation); exit 3 where none is kept for it."""
    installed = version("sglang") if installed_sglang() else None
    generation = RELEASED.get(installed)
    if generation is None or generation.name not in TABLES:
        raise environment_broken(f"sglang {installed} is installed; the tables are for "
                                 f"{', '.join(v for v, g in RELEASED.items() if g.name in TABLES)}")
    return installed, release_table(installed)


def release_table(release: str) -> tuple[SourceMutant, ...]:
    """The table of `release` (a version of `RELEASED` whose API generation has one): its generation's rows, less
    those that edit EAGLE's draft-extend graph runner where the release's campaigns run with that graph off
    (`server_settings`: no run would replay it, and 0.5.21's runner publishes before its replay, so the rows
    written on the later runner's text do not apply to it)."""
    rows = TABLES[RELEASED[release].name]
    if release in DRAFT_EXTEND_GRAPH_RACE:
        rows = tuple(m for m in rows if m.file != DRAFT_GRAPH_RUNNER)
    return rows


def apply(root: Path, mutant: SourceMutant, original: Path) -> None:
    path = root / "sglang" / mutant.file
    text = (original / mutant.file).read_text()
    for old, new in mutant.edits:
        if text.count(old) != 1:
            raise environment_broken(f"mutant {mutant.name}: its text occurs {text.count(old)} times in "
                                     f"{mutant.file} (this sglang is not the one the table was written for)")
        text = text.replace(old, new)
    path.unlink()  # break the hard link: the installed file stays as it is
    path.write_text(text)


def restore(root: Path, mutant: SourceMutant, original: Path) -> None:
    path = root / "sglang" / mutant.file
    path.unlink()
    os.link(original / mutant.file, path)
    for stale in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):  # the mutant's bytecode
        stale.unlink()


def linked_copy(original: Path, scratch: str) -> Path:
    """A copy of the installed package under `scratch`, its files hard links (an edit unlinks the file it rewrites):
    the folder to put first on the path."""
    root = Path(scratch) / "site"
    shutil.copytree(original, root / "sglang", copy_function=os.link, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def copy_first(root: Path, settings: dict[str, str]) -> dict:
    """This environment with the linked copy `root` first on PYTHONPATH and the table's server `settings`."""
    return {**os.environ, **settings,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}


def campaign(root: Path, name: str, args, out: Path) -> dict:
    report = out / name
    env = copy_first(root, args.settings)
    command = [sys.executable, "-m", "harness", "run", "--target", "sglang", "--device", args.device,
               "--examples", str(args.examples), "--report-dir", str(report), "--no-shrink", "--jobs", args.jobs] + (
                  ["--no-seeds"] if args.no_seeds else []) + (
                  ["--semantics", "pr", "--without", LATER_GATES] if args.semantics == "pr"
                  else ["--without", KNOWN_BUG_PATHS])
    began = time.perf_counter()
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"exit_code": None, "seconds": round(time.perf_counter() - began, 1), "outcome": "TIMEOUT",
                "stderr_tail": [f"the campaign ran past --timeout {args.timeout:g} s and was stopped"]}
    row = {"exit_code": done.returncode, "seconds": round(time.perf_counter() - began, 1),
           "outcome": {0: "ALIVE", 1: "KILLED", 3: "REFUSED"}.get(done.returncode, "BROKEN")}
    if done.returncode not in (0, 1):  # why it could not vouch: the harness's own last words
        row["stderr_tail"] = (done.stderr or done.stdout).strip().splitlines()[-3:]
    try:
        summary = json.loads((report / "summary.json").read_text())
    except (OSError, ValueError):
        summary = None
    if summary is None or (done.returncode == 1 and not summary.get("findings")):
        # Exit 1 means "found" only with a finding to show; anything else (a traceback, no summary) is broken.
        if done.returncode == 1:
            row.update(outcome="BROKEN", stderr_tail=(done.stderr or done.stdout).strip().splitlines()[-3:])
        return row
    findings = summary.get("findings", [])
    first = summary.get("first_detection") or {}
    row.update(cases=summary.get("cases"), findings=len(findings), examples_to_detect=first.get("examples"),
               seconds_to_detect=first.get("seconds"), found_on_seed=summary.get("found_on_seed"),
               oracle=findings[0].get("oracle") if findings else None,
               finding=findings[0].get("message", "")[:160] if findings else None,
               replay=findings[0].get("replay") if findings else None)
    return row


HARNESS_REPLAY = "python -m harness replay "


def mutant_replay(name: str, harness_replay: str) -> str:
    """The command that replays a finding of mutant `name`: the harness's replay on a copy with the edit applied
    (the harness's own command would replay it against the unmutated install, where it passes), after the server
    settings the harness's command sets first (`NAME=VALUE ...`)."""
    settings, found, arguments = harness_replay.partition(HARNESS_REPLAY)
    if not found or any("=" not in word for word in settings.split()):
        raise ValueError(f"not a harness replay command: {harness_replay[:60]!r}")
    return f"{settings}python benchmarks/sglang_source_mutants.py --only {name} --replay {arguments}"


def replay(root: Path, harness_args: list[str]) -> int:
    """`python -m harness replay HARNESS_ARGS` with the scratch copy first on the path (and this process's
    environment, the settings a replay command sets included): its exit code."""
    return subprocess.run([sys.executable, "-m", "harness", "replay", *harness_args],
                          env=copy_first(root, {})).returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=100)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--only", default=None, help="comma-separated mutant names")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per campaign")
    parser.add_argument("--jobs", default="auto", help="each campaign's `run --jobs` (N or auto): lower it to run "
                        "several parts of the table at once")
    parser.add_argument("--no-seeds", action="store_true",
                        help="draw every case of each campaign: skip the hand-written seed cases")
    parser.add_argument("--no-clean", action="store_true",
                        help="skip the unmutated copy's campaign (the control): only for a part of a table whose "
                             "other parts ran it with the same options")
    parser.add_argument("--out", default="benchmarks/sglang_source_mutants.json")
    parser.add_argument("--replay", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="with one --only mutant: run `python -m harness replay ARGS` on a copy with its edit "
                             "applied (everything after --replay is the harness's), instead of the campaigns")
    args = parser.parse_args()
    if args.examples < 1:
        parser.error(f"--examples={args.examples}: must be >= 1")
    if args.timeout <= 0:
        parser.error(f"--timeout={args.timeout:g}: must be > 0 seconds")
    installed, table = installed_table()
    args.settings = server_settings(installed)
    args.semantics = RELEASED[installed].semantics
    chosen = table
    if args.only:
        names = {n.strip() for n in args.only.split(",") if n.strip()}
        unknown = sorted(names - {m.name for m in table})
        if unknown:
            parser.error(f"--only: unknown mutant(s) {', '.join(unknown)}; allowed: {', '.join(m.name for m in table)}")
        chosen = tuple(m for m in table if m.name in names)
    if args.replay is not None and (not args.only or len(chosen) != 1 or not args.replay):
        parser.error("--replay: needs exactly one mutant in --only and the harness's replay arguments after it "
                     "(--case ...)")
    original = installed_sglang()
    if args.replay is not None:
        with tempfile.TemporaryDirectory(prefix="sglang-mutant-") as scratch:
            root = linked_copy(original, scratch)
            apply(root, chosen[0], original)
            return replay(root, args.replay)
    rows = []
    with tempfile.TemporaryDirectory(prefix="sglang-mutants-") as scratch:
        root, out = linked_copy(original, scratch), Path(scratch) / "reports"
        if args.settings:
            print(f"sglang {installed}: every campaign runs with {', '.join(f'{k}={v}' for k, v in args.settings.items())}"
                  " (its draft-extend graph publishes before the replay: a race of the release)", flush=True)
        clean = {"exit_code": 0, "skipped": True} if args.no_clean else campaign(root, "clean", args, out)
        print(f"{'(clean copy)':30} " + ("skipped (--no-clean)" if args.no_clean else
              f"exit {clean['exit_code']} {clean.get('cases')} cases, {clean.get('findings')} finding(s) "
              f"{clean['seconds']}s {clean.get('stderr_tail', '')}"), flush=True)
        if clean["exit_code"] != 0:
            print("error: the unmutated copy is not clean, so no mutant can be judged"
                  + (f": {clean['oracle']}: {clean['finding']}\n    replay: {clean['replay']}" if clean.get("finding")
                     else ""), file=sys.stderr)
            return 1
        for mutant in chosen:
            outcome, reason = mutant.not_run
            if outcome:  # listed, with the reason, never counted as found
                rows.append({"name": mutant.name, "file": mutant.file, "description": mutant.description,
                             "outcome": outcome, "reason": reason})
                print(f"{mutant.name:30} {outcome} (not run): {reason}", flush=True)
                continue
            apply(root, mutant, original)
            try:
                row = campaign(root, mutant.name, args, out)
            finally:
                restore(root, mutant, original)
            row.update(name=mutant.name, file=mutant.file, description=mutant.description)
            if row.get("replay"):
                row["replay"] = mutant_replay(mutant.name, row["replay"])
            rows.append(row)
            print(f"{mutant.name:30} {row['outcome']:7} {row.get('oracle') or '-':16} {row['seconds']:6.1f}s  "
                  f"{row.get('finding') or row.get('stderr_tail', [''])[-1]}", flush=True)
            if row.get("replay"):
                print(f"    replay: {row['replay']}", flush=True)
    # REFUSED (exit 3, the target cannot be driven, said why) counts as found, as a contract probe does
    killed = sum(r["outcome"] in ("KILLED", "REFUSED") for r in rows)
    ran = [r for r in rows if r["outcome"] not in NOT_RUN]
    unreachable, equivalent = (sum(r["outcome"] == outcome for r in rows) for outcome in NOT_RUN)
    listed = f"{unreachable} unreachable in this release, not run" + (
        f"; {equivalent} equivalent, not run" if equivalent else "")
    print(f"\n{killed}/{len(ran)} source mutants found ({listed}); clean copy: "
          + ("not run (--no-clean)" if args.no_clean else "0 findings"))  # an unclean one returned above
    with open(args.out, "w") as fh:
        json.dump({"sglang": installed, "device": args.device, "examples": args.examples, "seeds": not args.no_seeds,
                   "server_settings": args.settings, "clean": clean, "rows": rows}, fh, indent=1)
    return 0 if killed == len(ran) else 1


if __name__ == "__main__":
    sys.exit(main())
