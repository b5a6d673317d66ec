"""Which file a fact is about: (path, size, mtime_ns), read with one stat.

A fact measured or read from a file (its header facts, a measured footprint, a refused
window, a measured speed) holds only while the file has the same size and age.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple


class Identity(NamedTuple):
    """A tuple, so the store's (path, size, mtime_ns) columns compare equal to it."""

    path: str
    size: int
    mtime_ns: int


def identity_of(path: str | Path) -> Identity:
    """One stat of the file now; raises OSError when it is gone."""
    stat = os.stat(path)
    return Identity(str(path), stat.st_size, stat.st_mtime_ns)
