"""`differential`: both runs' outputs (attention, draft outputs, KV pools, backups) equal bit for bit."""

from __future__ import annotations

import torch

from harness.findings import Finding
from harness.oracles.registry import Judged, oracle
from harness.world import BatchWorld


@oracle("differential", "the overlapped run's outputs differ from the barriered run's, bit for bit")
def differential_oracle(judged: Judged) -> list[Finding]:
    overlapped, barriered = judged.overlapped, judged.barriered
    out = []
    for index, (a, b) in enumerate(zip(overlapped.outputs, barriered.outputs)):
        for name in sorted(set(a) | set(b)):
            if name not in a or name not in b:
                out.append(Finding("differential", "output-missing", f"output {name!r} exists in only one run", index))
                continue
            x, y = a[name], b[name]
            if x.shape != y.shape or not torch.equal(x, y):
                details = first_difference(name, x, y, barriered.worlds[index])
                out.append(Finding("differential", "output-differs", describe_difference(details), index,
                                   details=details))
    return out


def first_difference(name: str, x: torch.Tensor, y: torch.Tensor, world: BatchWorld) -> dict:
    """Where two runs' output `name` first differ, as the finding's details: `tensor`; for different shapes
    `shapes`; else `count`, `index`, the values there as printed (`overlapped`, `barriered`) and, for a
    row of attention or draft output, its `request`, `pool_row`, `token_row` and `position`."""
    if x.shape != y.shape:
        return {"tensor": name, "shapes": {"overlapped": list(x.shape), "barriered": list(y.shape)}}
    diff = (x != y) & ~(x.isnan() & y.isnan()) if x.is_floating_point() else x != y
    first = [int(i) for i in diff.nonzero()[0]]
    details = {"tensor": name, "count": int(diff.sum()), "index": first}
    if name in ("attention", "draft_extend"):
        row = first[1] if name == "attention" else first[0]
        rows = world.token_rows
        if row < len(rows):
            r, pos = rows[row]
            details.update(request=r, pool_row=world.req_pool_idx[r], token_row=row, position=pos)
    details.update(overlapped=f"{x[tuple(first)].item():.6g}", barriered=f"{y[tuple(first)].item():.6g}")
    return details


def where(details: dict) -> str:
    """The place a differing output's details name, as the message and the page print it."""
    if "token_row" in details:
        return (f"request {details['request']} (pool row {details['pool_row']}), token row {details['token_row']} "
                f"at position {details['position']}, index {details['index']}")
    return f"index {details['index']}"


def describe_difference(details: dict) -> str:
    name = details["tensor"]
    if "shapes" in details:
        return (f"{name}: shape {tuple(details['shapes']['overlapped'])} under overlap, "
                f"{tuple(details['shapes']['barriered'])} with the barrier")
    return (f"{name}: {details['count']} element(s) differ from the barriered run; first at {where(details)}: "
            f"overlapped {details['overlapped']}, barriered {details['barriered']}")
