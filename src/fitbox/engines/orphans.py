"""Children a previous fitbox left running: handed over by a fitbox that re-executed
itself (SIGHUP), or left by one SIGKILLed where PR_SET_PDEATHSIG could not act. Found from
the store's records at start, then adopted (box/supervision/adoption.py) or stopped here.

A record matches a live process only if both the pid and the process start time agree, so
a pid the kernel has since given to another program is never signalled; one is adopted
only if its command line is also the argv recorded at its launch.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

START_TIME_SLACK_S = 0.05


@dataclass(frozen=True)
class ChildRecord:
    row_id: int
    pid: int
    create_time: float
    argv: tuple[str, ...] = ()
    port: int | None = None
    artifact: str | None = None
    placement: dict[str, Any] | None = field(default=None, hash=False, compare=False)

    @classmethod
    def of(cls, row: dict[str, Any]) -> ChildRecord:
        """From a row of ``Store.open_children``."""
        argv = row.get("argv")
        return cls(
            row["row_id"],
            row["pid"],
            row["create_time"],
            tuple(str(a) for a in argv) if isinstance(argv, list) else (),
            row.get("port"),
            row.get("artifact"),
            row.get("placement") if isinstance(row.get("placement"), dict) else None,
        )


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


def runs_as_recorded(record: ChildRecord) -> str | None:
    """Why the live process of ``record`` is not the engine it recorded (None: it is): the
    same pid and start time, its command line the recorded argv, that argv naming the
    recorded artifact."""
    if not is_ours(record):
        return "not running (or its pid now belongs to another process)"
    try:
        cmdline = tuple(psutil.Process(record.pid).cmdline())
    except psutil.Error as exc:
        return f"its command line cannot be read ({exc})"
    if not record.argv or cmdline != record.argv:
        return "its command line is not the argv recorded at its launch"
    if record.artifact is None or record.artifact not in record.argv:
        return "its argv does not name the artifact recorded with it"
    return None


def healthy(port: int | None, timeout: float = 5.0) -> bool:
    """Whether the engine on ``port`` answers /health with 200."""
    if not port:
        return False
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            head = sock.recv(64)
    except OSError:
        return False
    return head.startswith((b"HTTP/1.1 200", b"HTTP/1.0 200"))


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
