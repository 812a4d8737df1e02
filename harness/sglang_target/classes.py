"""The classes of the real SGLang modules the sglang target drives, for the source check (the `contract`
oracle and `triage`). SGLang's part of the static check; the analyser itself (`harness.contracts.source`)
knows nothing of SGLang."""

from __future__ import annotations

import importlib

from harness.contracts.source import module_classes
from harness.errors import EnvironmentBroken
from harness.sglang_target import api

# The real SGLang modules the sglang target drives, and the eager runner, whose call sequence it replicates.
SGLANG_MODULES = (api.BACKEND, api.BASE_BACKEND, api.SPARSE_UTILS, api.GRAPH_RUNNER, api.BASE_GRAPH_RUNNER,
                  api.PUBLISHER, api.SPEC, "sglang.srt.model_executor.runner.eager_runner")


def sglang_classes() -> tuple[list[type], list[str]]:
    """Every class of the sglang modules the target drives, imported by name (so also on versions the target
    cannot drive), and the modules this version does not have. Any other import failure is a broken environment."""
    api.prepare_triton()
    modules, missing = [], []
    for name in SGLANG_MODULES:
        try:
            modules.append(importlib.import_module(name))
        except ModuleNotFoundError as exc:
            if not (exc.name and name.startswith(exc.name)):  # a dependency is missing, not the module
                raise EnvironmentBroken(f"static check: importing {name} failed: {exc}") from None
            missing.append(name)
        except Exception as exc:  # noqa: BLE001 - sglang raises anything at import when its pins are not met
            raise EnvironmentBroken(f"static check: importing {name} failed: {type(exc).__name__}: {exc}") from None
    if api.BACKEND in missing:
        raise EnvironmentBroken(f"static check: this sglang has no {api.BACKEND}")
    return module_classes(modules), missing
