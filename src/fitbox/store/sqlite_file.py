"""One SQLite file opened the way every fitbox store wants it: owner-only, WAL, a busy
timeout and foreign keys (the box's store, and the central's on its SQLite backend)."""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import stat
from pathlib import Path

log = logging.getLogger(__name__)


def connect(path: Path) -> sqlite3.Connection:
    _owner_only(path)
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA busy_timeout = 5000")
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            log.warning("store %s is in %s mode, not WAL", path, mode)
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
    except BaseException:
        conn.close()
        raise
    return conn


def _owner_only(path: Path) -> None:
    """The store holds the call log, key names and their salted digests: its folder (when
    made here) and file are its owner's alone. SQLite gives the -wal and -shm it makes the
    file's mode, so making the file first 0600 covers all three; a store an older fitbox
    left readable by others is narrowed (its owner, or root, may; anyone else just reads)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(OSError):
            part = Path(f"{path}{suffix}")
            mode = stat.S_IMODE(part.stat().st_mode)
            if mode & 0o077:
                part.chmod(mode & 0o700)
