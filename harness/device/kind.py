"""The two devices a campaign runs on, as a value resolved once, with what each one can do.

Every layer used to compare the device's name again (`== "cpu"`) to decide the same few things:
whether poison may index out of range, whether streams really overlap, whether a run gets a
process of its own. The answers live here, one property each, so a caller asks the question it
means. The kind is a `str` enum: reports, replay commands and the command line carry its value
unchanged, and a plain `"cpu"` still compares and hashes equal to `DeviceKind.CPU`.
"""

from __future__ import annotations

from enum import Enum

import torch


class DeviceKind(str, Enum):
    CPU = "cpu"  # the stream/event simulator: every interleaving is a schedule the harness picks
    CUDA = "cuda"  # real CUDA streams on a GPU

    def __str__(self) -> str:
        """The value, as `--device` takes it, in f-strings and `str()` alike."""
        return self.value

    @classmethod
    def of(cls, device: torch.device | str) -> DeviceKind | None:
        """The kind whose memory a torch device is; None for any other torch device (meta, a registered
        backend), which is neither the CPU's nor a GPU's plain memory."""
        return _BY_TORCH_TYPE.get(torch.device(device).type)

    @property
    def poison_out_of_range(self) -> bool:
        """Whether poisoned indices may point past a pool: the simulator reads them as any other row,
        while an out-of-range read on CUDA kills the process's context, so there poison stays in range."""
        return self is DeviceKind.CPU

    @property
    def real_concurrency(self) -> bool:
        """Whether the streams really overlap: a race is then a matter of timing (a finding records the
        window it was found in), and no schedule can be drawn, forced or replayed."""
        return self is DeviceKind.CUDA

    @property
    def isolates_runs(self) -> bool:
        """Whether a campaign runs in a process of its own by default: a device-side assert or an
        illegal address leaves the CUDA context unusable for everything after it in the process."""
        return self is DeviceKind.CUDA

    @property
    def uses_gpus(self) -> bool:
        """Whether the work occupies GPUs: worker counts, GPU sharing and GPU telemetry follow them."""
        return self is DeviceKind.CUDA

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.value)


_BY_TORCH_TYPE = {kind.value: kind for kind in DeviceKind}
