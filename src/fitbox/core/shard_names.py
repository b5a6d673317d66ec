"""A split GGUF's shard names, as llama-gguf-split writes them (``NAME-00001-of-00003.gguf``):
the one reading of them that the catalog, transfers, movers and reap share. Only the first
shard names the model; llama-server opens every shard of the set from it."""

from __future__ import annotations

import re
from dataclasses import dataclass

_STEM = re.compile(r"^(?P<base>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})$")


@dataclass(frozen=True)
class ShardName:
    base: str  # the set's name: the model's, when the catalog lists it
    index: int  # 1-based
    count: int

    def sibling(self, index: int) -> str:
        """The file name of this set's shard ``index``."""
        return f"{self.base}-{index:05d}-of-{self.count:05d}.gguf"

    def siblings(self) -> list[str]:
        """Every shard's file name, the first first."""
        return [self.sibling(i) for i in range(1, self.count + 1)]


def shard_of_stem(stem: str) -> ShardName | None:
    """The shard a file stem (its name without ``.gguf``) names, if it names one."""
    found = _STEM.match(stem)
    if found is None:
        return None
    return ShardName(found["base"], int(found["index"]), int(found["count"]))


def shard_of(file_name: str) -> ShardName | None:
    """The shard a GGUF's file name names, if it names one (a name not ending in ``.gguf``
    is no shard)."""
    return shard_of_stem(file_name[:-5]) if file_name.endswith(".gguf") else None
