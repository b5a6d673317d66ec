"""Weight files hashed once (migrations/0015_file_hashes.sql): a row per real path, valid
while the file keeps the size and mtime it had when hashed."""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class KeptHash:
    path: str  # the real path, symlinks resolved
    size: int
    mtime_ns: int
    sha256: str
    chunk_bytes: int
    chunks: tuple[str, ...]
    hashed_at: float = 0.0
    seconds: float | None = None

    def public(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "bytes": self.size,
            "sha256": self.sha256,
            "chunk_bytes": self.chunk_bytes,
            "chunks": len(self.chunks),
            "hashed_at": self.hashed_at,
            "seconds": self.seconds,
        }


def _kept(row: sqlite3.Row | tuple[Any, ...]) -> KeptHash:
    path, size, mtime_ns, sha256, chunk_bytes, chunks, hashed_at, seconds = tuple(row)
    return KeptHash(
        path, size, mtime_ns, sha256, chunk_bytes, tuple(json.loads(chunks)), hashed_at, seconds
    )


_COLUMNS = "path, size, mtime_ns, sha256, chunk_bytes, chunks, hashed_at, seconds"


def find(
    conn: sqlite3.Connection, path: str, size: int, mtime_ns: int, chunk_bytes: int
) -> KeptHash | None:
    """The kept hash of ``path`` if the file is still as it was when hashed."""
    row = conn.execute(
        f"SELECT {_COLUMNS} FROM file_hashes WHERE path = ? AND size = ? AND mtime_ns = ? "  # noqa: S608
        "AND chunk_bytes = ?",
        (path, size, mtime_ns, chunk_bytes),
    ).fetchone()
    return _kept(row) if row else None


def keep(conn: sqlite3.Connection, kept: KeptHash) -> None:
    conn.execute(
        f"INSERT OR REPLACE INTO file_hashes ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",  # noqa: S608
        (
            kept.path,
            kept.size,
            kept.mtime_ns,
            kept.sha256,
            kept.chunk_bytes,
            json.dumps(list(kept.chunks)),
            kept.hashed_at or time.time(),
            kept.seconds,
        ),
    )


def with_sha256(conn: sqlite3.Connection, sha256: str) -> list[KeptHash]:
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM file_hashes WHERE sha256 = ?",  # noqa: S608
        (sha256,),
    )
    return [_kept(r) for r in rows]


def every(conn: sqlite3.Connection, limit: int = 1000) -> list[KeptHash]:
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM file_hashes ORDER BY path LIMIT ?",  # noqa: S608
        (limit,),
    )
    return [_kept(r) for r in rows]
