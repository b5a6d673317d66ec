"""Re-pinning a running engine: every thread of its process to the CPUs it keeps.

A claim is set as the child's affinity before exec (engines/child.py), and every thread it
starts inherits it. When a later claim takes an idle engine's cores, its threads are moved
off them here, so the two never compute on one core (FORMULAS.md §CPU claims).
"""

from __future__ import annotations

import contextlib
import os

PASSES = 4  # a thread made while a pass runs is caught by the next; an engine makes few


def thread_ids(pid: int) -> list[int]:
    """Every thread of ``pid`` (Linux: /proc/PID/task); none when it has gone."""
    try:
        return sorted(int(tid) for tid in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return []


def pin_threads(pid: int, cpus: frozenset[int]) -> int:
    """Set every thread of ``pid`` to ``cpus``; returns how many were moved. A thread that
    ends meanwhile is skipped; one started meanwhile inherits from the thread that made it,
    so the loop runs again until a pass finds no thread it has not moved."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return 0
    moved: set[int] = set()
    for _ in range(PASSES):
        fresh = [tid for tid in thread_ids(pid) if tid not in moved]
        if not fresh:
            break
        for tid in fresh:
            with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
                os.sched_setaffinity(tid, cpus)
            moved.add(tid)
    return len(moved)
