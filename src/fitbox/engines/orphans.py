"""Children a previous fitbox left running (it was SIGKILLed where PR_SET_PDEATHSIG could
not act, or on another platform): found from the store's records and stopped at start.

A record matches a live process only if both the pid and the process start time agree, so
a pid the kernel has since given to another program is never signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass

import psutil

START_TIME_SLACK_S = 0.05


@dataclass(frozen=True)
class ChildRecord:
    row_id: int
    pid: int
    create_time: float
    argv0: str


def start_time(pid: int) -> float | None:
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def is_ours(record: ChildRecord) -> bool:
    try:
        process = psutil.Process(record.pid)
        same_start = abs(process.create_time() - record.create_time) <= START_TIME_SLACK_S
        return same_start and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def reap(record: ChildRecord, grace: float = 2.0) -> bool:
    """Stop a surviving child's whole group: SIGTERM, grace, SIGKILL. True if it was ours."""
    if not is_ours(record):
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(record.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and is_ours(record):
        time.sleep(0.05)
    if is_ours(record):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(record.pid, signal.SIGKILL)
    return True
