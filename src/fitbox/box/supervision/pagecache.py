"""The page cache kept warm for the file that loads next.

A swap stops its victims before it launches the newcomer; asking the kernel to read the
newcomer's file meanwhile (POSIX_FADV_WILLNEED) overlaps that read with the stop and the
spawn, so the child's mmap finds its pages in memory. It is a hint: a file the cache cannot
hold is read again by the engine, nothing fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path


def will_need(path: Path) -> bool:
    """Ask the kernel to start reading ``path`` into the page cache; False when it could
    not be asked (not a file, no fadvise on this platform)."""
    if not hasattr(os, "posix_fadvise") or not path.is_file():
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def warm(path: Path) -> None:
    """``will_need`` in a worker thread, not awaited: queueing the reads of a large file may
    take a while, and the swap goes on meanwhile."""
    with contextlib.suppress(RuntimeError):  # no running loop: nothing to overlap with
        asyncio.get_running_loop().run_in_executor(None, will_need, path)
