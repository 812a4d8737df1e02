"""SGLang's enums for the DSV4 prefill path, with the same names a reader would look for."""

from __future__ import annotations

import enum

from harness.errors import InvalidArgument


class ForwardMode(enum.Enum):
    EXTEND = "extend"
    DECODE = "decode"
    MIXED = "mixed"
    TARGET_VERIFY = "target_verify"
    DRAFT_EXTEND = "draft_extend"
    IDLE = "idle"

    def is_extend(self) -> bool:
        """SGLang counts MIXED and the speculative extends as extends."""
        return self in (ForwardMode.EXTEND, ForwardMode.MIXED, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND)

    def is_extend_without_speculative(self) -> bool:
        return self in (ForwardMode.EXTEND, ForwardMode.MIXED)

    def is_decode(self) -> bool:
        return self is ForwardMode.DECODE

    def is_target_verify(self) -> bool:
        return self is ForwardMode.TARGET_VERIFY

    def is_idle(self) -> bool:
        return self is ForwardMode.IDLE

    def is_draft_wide(self) -> bool:
        """A verify of the drafted tokens, or a draft extend (which stands for the draft extend after a verify): the
        batches whose every request an EAGLE-family server gives its draft width (`prepare_for_draft_extend`), and
        after which its worker extends the draft model as a `DRAFT_EXTEND_V2` batch."""
        return self in (ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND)


class SpeculativeAlgorithm(enum.Enum):
    NONE = "none"
    EAGLE = "eagle"
    EAGLE3 = "eagle3"
    NEXTN = "nextn"  # SGLang's name for MTP
    STANDALONE = "standalone"
    NGRAM = "ngram"
    DFLASH = "dflash"
    DSPARK = "dspark"

    def is_none(self) -> bool:
        return self is SpeculativeAlgorithm.NONE

    def is_dflash(self) -> bool:
        return self is SpeculativeAlgorithm.DFLASH

    def is_dspark(self) -> bool:
        return self is SpeculativeAlgorithm.DSPARK

    def is_dflash_family(self) -> bool:
        return self.is_dflash() or self.is_dspark()

    def is_eagle_family(self) -> bool:
        """Algorithms whose draft model runs an extend after target prefill and re-reads the tables."""
        return self in (SpeculativeAlgorithm.EAGLE, SpeculativeAlgorithm.EAGLE3, SpeculativeAlgorithm.NEXTN,
                        SpeculativeAlgorithm.STANDALONE)

    def supports_prefill_shared_read_done(self) -> bool:
        """0.5.23: DSPARK's draft KV inject writes at locations computed before the target forward."""
        return self.is_none() or self.is_dflash_family()

    @classmethod
    def parse(cls, name: str) -> "SpeculativeAlgorithm":
        """Accepts SGLang's spellings, MTP included (an alias of NEXTN)."""
        key = name.strip().upper()
        if key == "MTP":
            key = "NEXTN"
        try:
            return cls[key]
        except KeyError:
            allowed = ", ".join([m.name for m in cls] + ["MTP"])
            raise InvalidArgument(f"spec_algorithm={name!r} is not one of: {allowed}") from None


class SharedReadEnds(enum.IntEnum):
    """Where a backend's reads of scheduler-shared tables end (0.5.23 `base_attn_backend.py`)."""

    PRE_REPLAY = 1
    IN_REPLAY = 2
    POST_REPLAY = 3
    UNKNOWN = 4
