"""A bounded, read-only walk: at most ``max_depth`` levels below each root and ``max_dirs``
directories listed in all; hidden directories, symlinked directories and automount points
(mounts.py's rule) are never entered. It yields candidate files (``.gguf`` by name: a hint,
to be examined)."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator
from pathlib import Path

from .findings import Limits, Tally
from .mounts import NO_AUTOMOUNTS, Automounts


def walk(
    roots: list[Path], limits: Limits, tally: Tally, automounts: Automounts = NO_AUTOMOUNTS
) -> Iterator[Path]:
    """Breadth first, so a deep tree cannot starve the shallow places of other roots."""
    queue: deque[tuple[Path, int]] = deque((root, 0) for root in roots)
    seen: set[tuple[int, int]] = set()
    while queue:
        here, depth = queue.popleft()
        if here in automounts.points or (depth == 0 and automounts.point_over(here)):
            tally.automounts_skipped.append(str(here))
            continue
        if tally.dirs_visited >= limits.max_dirs:
            tally.dirs_left = True
            return
        try:
            st = os.stat(here)  # never wakes an automount (AT_NO_AUTOMOUNT)
            if automounts.is_unmounted_point(st):
                tally.automounts_skipped.append(str(here))
                continue
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            tally.dirs_visited += 1
            with os.scandir(here) as entries:
                listed = sorted(entries, key=lambda e: e.name)
        except OSError:
            tally.unreadable += 1
            continue
        for entry in listed:
            if entry.name.startswith("."):
                continue
            try:
                if entry.is_dir(follow_symlinks=False):
                    if depth + 1 > limits.max_depth:
                        tally.beyond_depth += 1
                    else:
                        queue.append((Path(entry.path), depth + 1))
                elif entry.name.lower().endswith(".gguf") and entry.is_file():
                    yield Path(entry.path)
            except OSError:
                tally.unreadable += 1
