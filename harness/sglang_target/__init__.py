"""`--target sglang`: the installed SGLang package's real DSV4 prefill decisions, snapshot and publication,
driven on the harness's device (the CPU simulator or CUDA). See `session.py` for what runs real SGLang code
and what is replaced.

Install (a separate environment; SGLang pins torch 2.14.1 and imports torchvision, whose PyPI build needs
CUDA torch's libraries, so the CPU build of torch 2.13.0 does not import it):

    pip install torch==2.14.1 torchvision==0.29.1
    pip install --no-deps sglang==0.5.23
    pip install numpy msgspec triton==3.8.0 transformers==5.19.0 tokenizers==0.23.2 gguf compressed-tensors==0.18.0 \
        apache-tvm-ffi==0.1.11 orjson pydantic psutil pyzmq aiohttp IPython pybase64 setproctitle einops pillow \
        starlette dill sentencepiece==0.2.1 openai==2.8.0 partial-json-parser uvicorn fastapi
"""

from __future__ import annotations

from harness.case import Case
from harness.sglang_target._api import SglangApi, load_api


class SglangTarget:
    """The installed sglang package as a target. Construction imports it and checks what it provides."""

    def __init__(self):
        self.api: SglangApi = load_api()
        self.name = f"sglang-{self.api.version}"
        self.version = self.api.version
        self.semantics = self.api.semantics
        self.semantics_supported = (self.api.semantics,)
        self.semantics_detail = self.api.describe()

    def open(self, case: Case, device):
        from harness.sglang_target.session import SglangSession

        return SglangSession(self.api, case, device)


def make_target() -> SglangTarget:
    """Factory for `--target harness.sglang_target:make_target` (and for `--target sglang`)."""
    return SglangTarget()


def differential_against_reference(case: Case, *, target: SglangTarget | None = None) -> list[str]:
    """Names of the fields where the real SGLang code and the reference model disagree on `case`."""
    from harness.sglang_target.differential import differential_against_reference as run

    return run(case, target=target)


__all__ = ["SglangTarget", "make_target", "differential_against_reference"]
