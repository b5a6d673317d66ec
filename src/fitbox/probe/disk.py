"""The drives holding model roots: their size and free space, read live."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil


@dataclass(frozen=True)
class DriveUsage:
    total: int
    free: int


def read_drive(path: Path) -> DriveUsage:
    """The drive holding ``path``, which must exist."""
    usage = psutil.disk_usage(str(path))
    return DriveUsage(total=int(usage.total), free=int(usage.free))


def storage_total(roots: Iterable[Path]) -> int:
    """The size of the drive holding the first model root that exists (0: none does)."""
    for root in roots:
        if root.is_dir():
            return read_drive(root).total
    return 0
