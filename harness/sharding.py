"""`--shard K/N`: one of N disjoint, reproducible parts of a case stream, a mutant list or a test list.

K counts from 1 (`--shard 1/2`, `--shard 2/2`), as CI matrices number their jobs. Part K holds the
items at positions K-1, K-1+N, K-1+2N, ... of the stream: round robin, so the parts differ in size
by at most one item and their union is the whole stream, each item exactly once. A campaign's case
stream is the order in which hypothesis draws cases for one seed; every shard draws the whole
stream (drawing is cheap next to judging) and judges its own part, so N shards with one seed judge
exactly the cases one unsharded campaign with that seed judges.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence, TypeVar

from harness.errors import InvalidArgument

T = TypeVar("T")
_SPEC = re.compile(r"(\d+)/(\d+)")


@dataclass(frozen=True)
class Shard:
    index: int  # 1..count
    count: int

    @classmethod
    def parse(cls, text: str, name: str = "shard") -> "Shard":
        """`K/N`; anything else is refused naming it `name`, the caller's name for it (the commands' --shard)."""
        match = _SPEC.fullmatch(text.strip())
        if not match or not 1 <= int(match[1]) <= int(match[2]):
            raise InvalidArgument(f"{name}={text!r}: K/N with 1 <= K <= N, for example 1/4")
        return cls(int(match[1]), int(match[2]))

    def owns(self, position: int) -> bool:
        """Whether the item at `position` (from 0) of the stream belongs to this part."""
        return position % self.count == self.index - 1

    def select(self, items: Sequence[T]) -> list[T]:
        return [item for i, item in enumerate(items) if self.owns(i)]

    def split(self, workers: int, worker: int) -> "Shard":
        """Worker `worker` (1..workers) of this part, as a part of the whole stream: the part's
        positions, dealt round robin to its workers."""
        return Shard(self.index + self.count * (worker - 1), self.count * workers)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def to_dict(self) -> dict:
        return {"index": self.index, "count": self.count}


WHOLE = Shard(1, 1)
