"""`kv`: the barriered run wrote exactly the KV entries the batch owns, nothing else."""

from __future__ import annotations

import torch

from harness.findings import Finding, RunRecord
from harness.oracles.registry import Judged, oracle
from harness.world import kv_contents


@oracle("kv", "the barriered run wrote KV entries the batch does not own, or wrong values into its own",
        applies=lambda judged: judged.barriered.crash is None)
def kv_check(judged: Judged) -> list[Finding]:
    return kv_oracle(judged.barriered)


def kv_oracle(run: RunRecord) -> list[Finding]:
    out = []
    for index, outputs in enumerate(run.outputs):
        for name, (where, values) in kv_contents(run.worlds[index], after_forward=True).items():
            got = outputs[f"pool.{name}"]
            want = torch.zeros_like(got)
            want[where] = values
            owned = torch.zeros(got.shape[:-1], dtype=torch.bool, device=got.device)
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
