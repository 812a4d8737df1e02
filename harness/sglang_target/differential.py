"""The real SGLang code against the reference model, field by field, on one drawn case.

Both targets run every batch of the case on a fresh device (the CPU simulator, or CUDA) with nothing
mutating the tables, so the snapshot each builds is a function of the same world. Compared, bit for bit (as integer values: the
reference keeps `query_pos` as int64 and the offsets as host lists, SGLang int32 tensors):

- the sparse prefill chunk cache: `swa_token_ids`, `swa_offsets`, `swa_first_pos`, `swa_gather_lens`,
  `query_pos`, `c0_combined_indices`, `c0_combined_lens` (and whether one was built at all: `chunk_cache`);
- the publication decision (`publish`), the snapshot's and the forward's sparse decisions
  (`snapshot_sparse`, `use_sparse_prefill`), the snapshot's query-row count (`snapshot_num_qo_tokens`);
- the attention outputs (`attention`; with EAGLE's draft model, `draft_extend`), to 1e-5 (the two workspaces are
  laid out differently, so float sums may round differently; plus 2^-7 of the value where one is bf16, as SGLang's
  real forward returns it: `attention.OUTPUT_RTOL`);
- what the backend declares for every forward mode, `shared_read_ends(MODE)`, under the case's spec
  algorithm: runners outside the prefill path (the decode and verify graph runner) publish on it.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Optional

import torch

from harness.case import Case
from harness.device import make_device
from harness.model.attention import output_rtol
from harness.model.enums import ForwardMode
from harness.targets import ReferenceTarget, load_batch, load_target
from harness.targets.protocol import Forward, ProbeRecord, Publish, Snapshot, first, noted
from harness.world import PoolSizes, build_world

CACHE_FIELDS = ("swa_token_ids", "swa_offsets", "swa_first_pos", "swa_gather_lens", "query_pos",
                "c0_combined_indices", "c0_combined_lens")
ATTENTION_ATOL = 1e-5
# The attention outputs compared, each to ATTENTION_ATOL and the output's rtol: the target's layers, and the draft
# model's extend after a prefill (EAGLE's NextN layer: window attention over the first layer's SWA latents).
ATTENTION_OUTPUTS = ("attention", "draft_extend")
# A cache field that the releases before 0.5.21 do not keep (their query rows are the extend's own positions):
# compared where both caches have it.
LATER_CACHE_FIELDS = ("query_pos",)


def _as_ints(value) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().to(torch.int64)
    return torch.tensor(list(value), dtype=torch.int64)


def _run(target, case: Case, device_name: str) -> list[dict]:
    """Per batch: the notes, the outputs and the chunk cache (None when none was built)."""
    device = make_device(device_name)
    session = target.open(case, device)
    sizes = PoolSizes.for_case(case)
    out = []
    for index, batch in enumerate(case.batches):
        world = build_world(case, index, sizes, device.torch_device)
        fb = load_batch(session, device, world)
        session.current_batch = fb
        outputs = session.step(fb, graph=batch.graph, process_batch_result=lambda: None, after_launch=lambda: None)
        device.synchronize()
        if batch.mode is ForwardMode.IDLE:  # no forward: what the backend keeps is not this batch's
            cache = None
        elif hasattr(session, "chunk_cache"):
            cache = session.chunk_cache()
        else:
            cache = getattr(session.model_runner.attn_backend.forward_metadata, "sparse_prefill_cache", None)
        out.append({"notes": session.probe.take(), "outputs": {k: v.detach().cpu().clone() for k, v in outputs.items()},
                    "cache": None if cache is None else {f: _as_ints(getattr(cache, f)) for f in CACHE_FIELDS
                                                         if f not in LATER_CACHE_FIELDS or hasattr(cache, f)},
                    "declared": _declarations(session)})
    return out


def _declarations(session) -> dict[str, str]:
    """{mode name: the backend's shared_read_ends for it}, asked in each target's own mode of those batches: SGLang
    runs a draft extend as `DRAFT_EXTEND_V2` (what its draft-extend graph runner asks the backend), not the
    `DRAFT_EXTEND` of the same name, which no DSV4 batch runs."""
    runner = session.model_runner
    backend = runner.attn_backend
    if hasattr(session, "chunk_cache"):  # the sglang session: the real backend takes sglang's enum
        own_mode = runner.sglang_mode_of
    else:
        own_mode = _same_mode
    declared = {}
    for mode in ForwardMode:
        own = own_mode(mode)
        if own is not None:
            declared[mode.name] = backend.shared_read_ends(own).name
    return declared


def _same_mode(mode: ForwardMode) -> ForwardMode:
    return mode


def _trim_skipped_columns(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Index rows of different widths where the wider one's extra columns are all -1 (skipped): SGLang
    sizes its combined rows by the real window (128) whatever the case's window, so only the entries
    count."""
    if x.dim() == y.dim() == 2 and x.shape[0] == y.shape[0] and x.shape[1] != y.shape[1]:
        width = min(x.shape[1], y.shape[1])
        if bool((x[:, width:] == -1).all()) and bool((y[:, width:] == -1).all()):
            return x[:, :width], y[:, :width]
    return x, y


# What a padded query row of the chunk cache holds: "padding rows are never combined" (no index, length 0,
# position 0).
_PADDING_ROW = {"query_pos": 0, "c0_combined_indices": -1, "c0_combined_lens": 0}


def _trim_padding_rows(name: str, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-query fields of different row counts where the longer one's extra rows are padding: in a graph replay
    SGLang's attention op slices the bucket's rows to the live ones before the forward builds its cache, while
    the reference model's forward runs the bucket; only the live rows carry entries."""
    empty = _PADDING_ROW.get(name)
    if empty is None or x.dim() != y.dim() or x.shape[0] == y.shape[0]:
        return x, y
    rows = min(x.shape[0], y.shape[0])
    longer = x if x.shape[0] > rows else y
    if bool((longer[rows:] == empty).all()):
        return x[:rows], y[:rows]
    return x, y


def describe_difference(x: torch.Tensor, y: torch.Tensor) -> str:
    """Where two integer tensors first differ, in a line a person can read: the shapes, the first index
    whose values differ (or where one ends), and the first row of each there."""
    shapes = f"shapes {tuple(x.shape)} / {tuple(y.shape)}"
    if x.dim() != y.dim():
        return f"sglang {x.flatten().tolist()[:16]} vs reference {y.flatten().tolist()[:16]} ({shapes})"
    common = tuple(min(a, b) for a, b in zip(x.shape, y.shape))
    region = tuple(slice(0, n) for n in common)
    unequal = (x[region] != y[region]).nonzero()
    if len(unequal):
        at = tuple(unequal[0].tolist())
        row = at[:1]
        return (f"first at {list(at)}: sglang {x[at].item()} vs reference {y[at].item()}; that row: sglang "
                f"{x[row].flatten().tolist()[:16]} vs reference {y[row].flatten().tolist()[:16]} ({shapes})")
    extra, longer = (x, "sglang") if x.numel() > y.numel() else (y, "reference")
    first_extra = common[0] if x.shape[0] != y.shape[0] else 0
    return (f"equal where both have entries; {longer} has more, from row {first_extra}: "
            f"{extra[first_extra:].flatten().tolist()[:16]} ({shapes})")


def _fields(record: Optional[ProbeRecord]) -> Optional[dict]:
    """A record's fields as the message has always shown them ({'rows': 8, 'sparse': True}), or None."""
    return asdict(record) if record is not None else None


def compare(case: Case, real: list[dict], ref: list[dict]) -> dict[str, str]:
    """{field name: what differs}; a field differing in several batches is reported once, at its first."""
    diffs: dict[str, str] = {}

    def differ(name: str, index: int, why: str) -> None:
        diffs.setdefault(name, f"batch {index}: {why}")

    for index, (a, b) in enumerate(zip(real, ref)):
        pub_a, pub_b = noted(a["notes"], Publish), noted(b["notes"], Publish)
        if pub_a != pub_b:
            differ("publish", index, f"sglang {'published' if pub_a else 'did not publish'}, reference "
                                     f"{'published' if pub_b else 'did not'}")
        snap_a, snap_b = first(a["notes"], Snapshot), first(b["notes"], Snapshot)
        if (snap_a is None) != (snap_b is None):
            differ("snapshot", index, f"snapshot built by {'sglang only' if snap_a else 'the reference only'}")
        elif snap_a is not None:
            if snap_a.sparse != snap_b.sparse:
                differ("snapshot_sparse", index, f"sglang sparse={snap_a.sparse}, reference {snap_b.sparse}")
            if snap_a.num_qo_tokens != snap_b.num_qo_tokens:
                differ("snapshot_num_qo_tokens", index, f"{snap_a.num_qo_tokens} vs {snap_b.num_qo_tokens}")
        fwd_a, fwd_b = first(a["notes"], Forward), first(b["notes"], Forward)
        if (fwd_a is None) != (fwd_b is None) or (fwd_a and fwd_a.sparse != fwd_b.sparse):
            differ("use_sparse_prefill", index, f"sglang {_fields(fwd_a)}, reference {_fields(fwd_b)}")
        ca, cb = a["cache"], b["cache"]
        if (ca is None) != (cb is None):
            differ("chunk_cache", index, f"built by {'sglang only' if ca is not None else 'the reference only'}")
        elif ca is not None:
            for name in CACHE_FIELDS:
                if name in LATER_CACHE_FIELDS and not (name in ca and name in cb):
                    continue
                x, y = _trim_skipped_columns(*_trim_padding_rows(name, ca[name], cb[name]))
                if x.shape != y.shape or not torch.equal(x, y):
                    differ(name, index, describe_difference(x, y))
        for name in ATTENTION_OUTPUTS:
            oa, ob = a["outputs"].get(name), b["outputs"].get(name)
            if (oa is None) != (ob is None):
                differ(name, index, f"present in {'sglang' if oa is not None else 'the reference'} only")
            elif oa is not None and (oa.shape != ob.shape or not torch.allclose(
                    oa.double(), ob.double(), atol=ATTENTION_ATOL,
                    rtol=max(output_rtol(oa.dtype), output_rtol(ob.dtype)))):
                err = float((oa.double() - ob.double()).abs().max()) if oa.shape == ob.shape else float("nan")
                differ(name, index, f"max |difference| {err:.3g} (shapes {tuple(oa.shape)} / {tuple(ob.shape)})")
        for mode in a["declared"].keys() & b["declared"].keys():
            if a["declared"][mode] != b["declared"][mode]:
                differ(f"shared_read_ends({mode})", index, f"sglang declares {a['declared'][mode]}, reference "
                                                           f"{b['declared'][mode]}")
    if len(real) != len(ref):
        diffs.setdefault("batches", f"sglang ran {len(real)} batch(es), the reference {len(ref)}")
    return diffs


def differential_details(case: Case, *, target=None, reference=None, device: str = "cpu") -> dict[str, str]:
    case.validate()
    target = target or load_target("sglang")
    return compare(case, _run(target, case, device), _run(reference or ReferenceTarget(), case, device))


def differential_against_reference(case: Case, *, target=None, reference=None, device: str = "cpu") -> list[str]:
    return list(differential_details(case, target=target, reference=reference, device=device))
