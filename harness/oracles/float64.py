"""`float64`: the barriered run's attention against a float64 reference computed from positions and latents
alone (`harness.model.attention.reference_attention`), which never reads the tables the target built."""

from __future__ import annotations

import torch

from harness.case import Case
from harness.findings import Finding, RunRecord
from harness.model.attention import output_rtol, reference_attention
from harness.model.pools import to_device
from harness.oracles.registry import Judged, oracle

FLOAT64_ATOL = 1e-4  # plus the output dtype's own rounding (`attention.OUTPUT_RTOL`: 2^-7 of the value for bf16)
FLOAT64_MAX_ROWS = 256  # rows checked per layer on big batches: both ends plus an even sample


def where(details: dict) -> str:
    """The row a float64 mismatch's details name, as the message and the page print it."""
    return f"token row {details['token_row']} (request {details['request']}, position {details['position']})"


def _barriered_ran(judged: Judged) -> bool:
    return judged.barriered.crash is None


@oracle("float64", "the barriered attention differs from a float64 reference computed from positions",
        applies=_barriered_ran)
def float64_check(judged: Judged) -> list[Finding]:
    return float64_oracle(judged.case, judged.barriered)


def float64_oracle(case: Case, run: RunRecord) -> list[Finding]:
    out = []
    for index, outputs in enumerate(run.outputs):
        world = run.worlds[index]
        if "attention" not in outputs or world.num_tokens == 0:
            continue
        got = outputs["attention"]
        rtol = output_rtol(got.dtype)
        rows = rows_to_check(world.num_tokens)
        picked = to_device(torch.tensor(rows, dtype=torch.int64), got.device)
        wants = [reference_attention(world, layer, rows=rows) for layer in range(len(case.dims.layer_ratios))]
        # Each error over its element's tolerance: above 1 fails.
        ratios = [(got[layer].index_select(0, picked).double() - want).abs() / (FLOAT64_ATOL + rtol * want.abs())
                  for layer, want in enumerate(wants)]
        # One read of every layer's worst ratio: the device computes the next layer's reference while
        # the host issues it, instead of waiting for each layer's maximum in turn.
        worst_per_layer = torch.stack([e.max() for e in ratios]).tolist()
        for layer, (ratio, worst) in enumerate(zip(ratios, worst_per_layer, strict=True)):
            if not worst <= 1:  # NaN fails too
                flat = int(ratio.flatten().nan_to_num(float("inf")).argmax())
                at = divmod(flat, ratio.shape[1] * ratio.shape[2])
                row = rows[at[0]]
                want = float(wants[layer].flatten()[flat])
                error = abs(float(got[layer, row].flatten()[at[1]].double()) - want)
                r, pos = world.token_rows[row]
                tolerance = f"{FLOAT64_ATOL} + {rtol:.3g} x |reference|" if rtol else f"{FLOAT64_ATOL}"
                details = {"layer": layer, "ratio": case.dims.layer_ratios[layer], "token_row": row, "request": r,
                           "position": pos, "max_error": f"{error:.3g}", "tolerance": tolerance}
                out.append(Finding("float64", "attention-mismatch",
                                   f"batch {index} layer {layer} (ratio {details['ratio']}): error "
                                   f"{details['max_error']} > {tolerance} at {where(details)}", index, details=details))
                break
    return out


def rows_to_check(total: int) -> list[int]:
    """The token rows the oracle checks in a batch of `total`: all of them, or both ends and an even sample."""
    if total <= FLOAT64_MAX_ROWS:
        return list(range(total))
    step = total / (FLOAT64_MAX_ROWS - 2)
    return sorted({0, total - 1, *(int(i * step) for i in range(FLOAT64_MAX_ROWS - 2))})
