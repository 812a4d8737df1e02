"""Race detection and verification for SGLang's DeepSeek-V4 prefill path.

The public surface; the rest of the package is internals:

    from harness import Case, Batch, Request, Mutation, ReferenceTarget, run_case, run_campaign
    result = run_case(ReferenceTarget(), Case(), "cpu")
    result.findings, result.replay
"""

from harness.campaign import run_campaign
from harness.case import Batch, Case, Dims, Flags, Mutation, Request
from harness.engine import Finding, run_case
from harness.errors import EnvironmentBroken, HarnessError, InvalidArgument
from harness.targets import ReferenceTarget, load_target

__all__ = ["Batch", "Case", "Dims", "EnvironmentBroken", "Finding", "Flags", "HarnessError", "InvalidArgument",
           "Mutation", "ReferenceTarget", "Request", "load_target", "run_campaign", "run_case"]
