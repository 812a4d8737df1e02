"""Race detection and verification for SGLang's DeepSeek-V4 prefill path.

The public surface; the rest of the package is internals:

    from harness import Case, Batch, Request, Mutation, ReferenceTarget, run_case, run_campaign
    result = run_case(ReferenceTarget(), Case(), "cpu")
    result.findings, result.replay

The names load when first used (PEP 562), not when the package does: every module of the harness
imports this package first, and `python -m harness --help` or a usage error must not wait for torch.
"""

from __future__ import annotations

import importlib

from harness.errors import EnvironmentBroken, HarnessError, InvalidArgument

# public name -> the module that defines it
_LAZY = {"run_campaign": "harness.campaign", "Batch": "harness.case", "Case": "harness.case", "Dims": "harness.case",
         "Flags": "harness.case", "Mutation": "harness.case", "Request": "harness.case", "Finding": "harness.engine",
         "run_case": "harness.engine", "ReferenceTarget": "harness.targets", "TargetSpec": "harness.targets",
         "load_target": "harness.targets"}

__all__ = ["Batch", "Case", "Dims", "EnvironmentBroken", "Finding", "Flags", "HarnessError", "InvalidArgument",
           "Mutation", "ReferenceTarget", "Request", "TargetSpec", "load_target", "run_campaign", "run_case"]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'harness' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # once
    return value
