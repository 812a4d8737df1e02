"""The command line's named choices that more than its parser reads, in a module that imports
nothing: `python -m harness --help` and a usage error answer without loading torch (about 4 s),
and the modules that run the commands check against the same names."""

from __future__ import annotations

# The campaign profiles: their size, and whether hypothesis derandomizes them (then no example database).
PROFILES = {
    "dev": dict(max_examples=50, derandomize=False),
    "ci": dict(max_examples=200, derandomize=True),
    "nightly": dict(max_examples=5000, derandomize=False),
}
NIGHTLY_STEPS = ("pytest", "campaign", "mutants", "sanitize")
SANITIZER_TOOLS = ("racecheck", "synccheck", "memcheck", "initcheck", "all")
SANITIZER_TARGETS = ("reference", "sglang")
# --jobs auto's ceiling: on an H200 with 16 cores 6, 8 and 12 jobs judged the same cases per second
AUTO_JOBS_MAX = 8
