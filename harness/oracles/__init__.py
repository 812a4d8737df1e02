"""The oracles, one module each, and their registry (`registry.py`).

Imported here in the order they judge a case (the order of their findings): a run that raised first,
then the differential, the tracker, the policy, the fast path (the tracker's timeline), freshness (the
plans a forward read), the two checks of the barriered run, and the two that ask
a target that is not the model.
"""

from harness.oracles import (  # noqa: F401 - each registers its oracle
    execution,
    differential,
    happens_before,
    policy,
    fast_path,
    freshness,
    float64,
    kv,
    reference,
    contract,
)
from harness.oracles.registry import Judged, Oracle, apply_oracles, oracle, oracle_names, parse_oracles, registered, unregister

__all__ = ["Judged", "Oracle", "apply_oracles", "oracle", "oracle_names", "parse_oracles", "registered", "unregister"]
