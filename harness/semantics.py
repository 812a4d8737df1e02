"""The two designs of the prefill shared-read publication the reference model implements, as a value.

`pr` is the design of the pull request (#35947): only the DFLASH family publishes, the runner prepares
the snapshot and publishes from the forward batch, READ_DONE is off unless asked for. `0.5.23` is the
released resolver design (#37958): the backend resolves the read ends, READ_DONE is on by default and
the coarse barrier closes the publish. Every layer used to compare the name (`semantics == "pr"`) and
decide one of these again; each is a property here, so a caller asks the question it means. The enum is
`str`-valued: case JSON, reports and `--semantics` carry the value unchanged, and `"pr"` compares equal.
"""

from __future__ import annotations

from enum import Enum


class Semantics(str, Enum):
    PR = "pr"
    V0_5_23 = "0.5.23"

    def __str__(self) -> str:
        """The value, as `--semantics` takes it, in f-strings and `str()` alike."""
        return self.value

    @property
    def read_done_by_default(self) -> bool:
        """SGLANG_ENABLE_PREFILL_WAR_READ_DONE left unset: PR-era off, 0.5.23 on (#37958)."""
        return self is Semantics.V0_5_23

    @property
    def coarse_barrier_closes_publish(self) -> bool:
        """Whether SGLANG_FORCE_COARSE_WAR_BARRIER closes the publish: in 0.5.23 the resolver answers
        UNKNOWN; PR-era the event is still recorded and only the scheduler ignores it."""
        return self is Semantics.V0_5_23

    @property
    def dflash_family_only(self) -> bool:
        """PR-era: only a DFLASH-family spec publishes; 0.5.23 asks the spec
        (`supports_prefill_shared_read_done`), which lets the plain EXTEND of no spec publish too."""
        return self is Semantics.PR

    @property
    def resolves_read_ends(self) -> bool:
        """0.5.23: the backend resolves the read ends (`resolve_prefill_shared_read_ends`) and the publisher
        takes them; PR-era the runner prepares the snapshot and publishes from the forward batch, and an
        EXTEND whose metadata holds the snapshot declares its reads ended before the replay."""
        return self is Semantics.V0_5_23


SEMANTICS = tuple(Semantics)
