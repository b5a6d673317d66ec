"""How far a loading child has read its weights, from the kernel's own counts.

llama-server prints no progress while it loads (its load log has the buffer sizes, not how
much is in), so the figure is read from /proc: the resident pages of the child's mappings
of the file (the default, mmap load: pages count whether they came from disk or from the
page cache); where no process maps the file (a --no-mmap load), the bytes it has read(),
which then are mostly the weights. Bounded by the file's size. The child's whole process
tree counts (a wrapper runs the engine below it).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import psutil


def bytes_read(pid: int, path: Path, size: int) -> int:
    """Bytes of ``path`` (``size`` bytes) the process ``pid`` and its children hold or read."""
    mapped, read, maps = 0, 0, False
    with contextlib.suppress(psutil.Error, OSError):
        root = psutil.Process(pid)
        target = str(path.resolve())
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error, OSError):
                found = [m.rss for m in proc.memory_maps(grouped=True) if m.path == target]
                maps, mapped = maps or bool(found), mapped + sum(found)
                read += proc.io_counters().read_chars
    return min(size, mapped if maps else read)
