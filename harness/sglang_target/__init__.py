"""`--target sglang`: the installed SGLang package's real DSV4 prefill decisions, snapshot and publication,
driven on the harness's device (the CPU simulator or CUDA). See `session.py` for what runs real SGLang code
and what is replaced.

SGLang's Triton kernels run interpreted on the CPU simulator and compiled on CUDA; the process picks one
when triton is first imported (interpreted unless a GPU is visible; TRITON_INTERPRET overrides it).
On CUDA, SGLang's modules take their CUDA branches at import, which import its CUDA kernel packages
(`sgl_kernel` from sglang-kernel, ...): those must be installed as SGLang's own requirements say.

Every released sglang with this path (0.5.19 to 0.5.23) is recognised as one API generation
(`generations.py`: `resolver` 0.5.23, `pr-late` 0.5.21-0.5.22, `pr-early` 0.5.19-0.5.20), named with the
version in the target's description. The configuration namespaces SGLang reads are published by SGLang's
own ServerArgs resolution of a tiny DSV4 model (`server.py`).

Install (its own environment: SGLang pins torch 2.14.1, and the CPU build of torch 2.13.0 cannot import
torchvision, which sglang imports):

    python3 -m venv .venv-sglang
    .venv-sglang/bin/pip install -r harness/sglang_target/requirements-cpu.txt
    .venv-sglang/bin/pip install --no-deps sglang==0.5.23
    .venv-sglang/bin/pip install --no-deps -e .

Another release goes, without its dependencies, into a folder first on `PYTHONPATH` over that environment
(`.sglang-0.5.NN`), a PR-era one (0.5.19, 0.5.20, 0.5.21) with the packages `requirements-cpu-pr.txt` lists
(transformers 5.12.1, ...); 0.5.22 pins what `requirements-cpu.txt` installs.
"""

from __future__ import annotations

import gc

from harness.case import Case
from harness.contracts.source import check_classes
from harness.sglang_target import differential
from harness.sglang_target.api import SglangApi, load_api
from harness.sglang_target.classes import sglang_classes
from harness.sglang_target.platform import bound_heap_growth
from harness.sglang_target.real_backend import fixed_dims, stand_in_rows
from harness.sglang_target.session import SglangSession
from harness.targets import TargetSpec
from harness.targets.protocol import Target


class SglangTarget(Target):
    """The installed sglang package as a target. Construction imports it and checks what it provides."""

    # SGLang's EAGLE worker verifies and draft-extends every request at the server's draft width, and a CP server
    # verifies at that width whatever its algorithm: a campaign's EAGLE-family and CP cases are drawn so, the draft
    # extend after an EAGLE verify runs SGLang's draft runner, and a CP case's verify SGLang's plan and forward
    uniform_draft_width = True

    def __init__(self):
        self.api: SglangApi = load_api()
        bound_heap_growth()  # DSV4-sized cases fragment glibc's heap otherwise (see there)
        self.name = f"sglang-{self.api.version}"
        self.version = self.api.version
        self.semantics = self.api.semantics
        self.semantics_supported = (self.api.semantics,)
        settings = TargetSpec.environment()  # the server's own, as it reads them (replay commands set them again)
        self.description = self.api.describe() + (f"; server settings: {', '.join(settings)}" if settings else "")
        # Before 0.5.23 the eager runner shards a CP batch across ranks and all-gathers the result
        # (`_execute_extend_cp`): one process cannot run it; 0.5.23's DSV4 owns the CP layout in its model.
        self.cannot_run = frozenset() if self.api.generation.runs_cp else frozenset({"cp_active"})
        self.graph_contracts = self.api.graph_contracts  # DSV4's prefill graph is the breakable one only
        self.fixed_dims = fixed_dims(self.api)  # the release's backend asserts DSV4's page size, head_dim and top-k
        # compiled extensions that could not load, stood in; for the real forward FlashMLA, without a GPU JIT kernels
        self.stand_ins = self.api.stand_ins.describe() + stand_in_rows(self.api)
        self._contract_breaks: list[str] | None = None
        # What is alive now (sglang and torch imported, the published server: some 700,000 objects) stays; the
        # collection before each session then walks only what the cases made (see `open`).
        gc.freeze()

    def open(self, case: Case, device):
        """A session holds SGLang's pools, backend and runners in reference cycles (a runner and its model
        runner point at each other), at DSV4's sizes up to gigabytes; Python's cycle collector reaches an old
        session only rarely, so a campaign's memory grew by a session a case until it was killed out of memory
        (a 3000-token case: 1 GB a case). The previous sessions are collected before each new one.

        A session is a server process of its own: SGLang's process-wide pool of graph input buffers
        (`input_buffers.share_input_buffer`, keyed by a buffer's name and size) starts empty, as at a server's
        start-up. Else this case's graph runner adopts the last case's `out_cache_loc` buffer, and its start-up
        capture translates that case's slots through this case's Full-to-SWA mapping (out of its range on CUDA: a
        device-side assert that no SGLang server can meet)."""
        gc.collect()
        self.api.mods["input_buffers"]._forward_input_buffer_pool.clear()
        return SglangSession(self.api, case, device)

    def contract_breaks(self) -> list[str]:
        """The `contract` oracle's question, asked once: attributes the real source reads but never assigns.
        A PR-era release's backend is built without its `__init__` (as SGLang's unit tests do), so a deleted
        assignment there changes no run; only the source shows it (0.5.23's runs its `__init__`)."""
        if self._contract_breaks is None:
            self._contract_breaks = [str(b) for r in check_classes(sglang_classes()[0]) for b in r.breaks]
        return self._contract_breaks

    def reference_differences(self, case: Case, device_name: str) -> dict[str, str]:
        """The `reference` oracle's question: {field: what differs} between this code and the model."""
        return differential.differential_details(case, target=self, device=device_name)


def make_target() -> SglangTarget:
    """Factory for `--target harness.sglang_target:make_target` (and for `--target sglang`)."""
    return SglangTarget()


def differential_against_reference(case: Case, *, target: SglangTarget | None = None, reference=None,
                                   device: str = "cpu") -> list[str]:
    """Names of the fields where the real SGLang code and the reference model (or `reference`) disagree,
    both run on `device` ("cpu": the simulator, or "cuda")."""
    return differential.differential_against_reference(case, target=target, reference=reference, device=device)


__all__ = ["SglangTarget", "make_target", "differential_against_reference"]
