"""Faults done to a store file from outside, as an unlucky operator or an attacker would:
pages overwritten, the file deleted."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

PAGE = 4096  # SQLite's default page size, the store's


def checkpointed(path: Path, bound_s: float = 30.0) -> None:
    """Move every committed page from the WAL into the file and restart the WAL (so the
    writer's connection reads pages from the file again at its next transaction)."""
    deadline = time.monotonic() + bound_s
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA busy_timeout = 5000")
        while conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]:  # busy
            assert time.monotonic() < deadline, "the store never let a checkpoint through"


def root_page(path: Path, table: str) -> int:
    with sqlite3.connect(path) as conn:
        return int(
            conn.execute("SELECT rootpage FROM sqlite_schema WHERE name = ?", (table,)).fetchone()[
                0
            ]
        )


def overwrite_pages(path: Path, first: int, count: int) -> None:
    """Scribble over ``count`` pages from page ``first`` (1 is the header's), in place."""
    with open(path, "r+b") as f:
        f.seek((first - 1) * PAGE)
        f.write(b"\xa5" * PAGE * count)


def delete_store(path: Path) -> None:
    """``rm fitbox.sqlite3*``: the file and its -wal and -shm."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
