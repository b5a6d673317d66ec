"""The store: one SQLite file, one writer thread that owns the connection.

Callers on the event loop enqueue work and await it. A failed write (disk full, a damaged
file) is counted and logged; it never fails the call that caused it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from fitbox.store.migrations import load_migrations, migrate

log = logging.getLogger(__name__)
T = TypeVar("T")

_CALL_COLUMNS = frozenset(
    {
        "artifact",
        "outcome",
        "http_status",
        "error_code",
        "device",
        "window",
        "evicted",
        "admitted_at",
        "load_start_at",
        "load_ready_at",
        "first_byte_at",
        "last_byte_at",
        "prompt_tokens",
        "completion_tokens",
    }
)


def connect(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA busy_timeout = 5000")
    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        log.warning("store %s is in %s mode, not WAL", path, mode)
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


@dataclass
class CallStart:
    request_id: str
    endpoint: str
    model_asked: str | None
    stream: bool
    received_at: float


class Store:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.write_failures = 0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fitbox-store")
        self._conn = self._executor.submit(self._open).result()

    def _open(self) -> sqlite3.Connection:
        conn = connect(self.path)
        migrate(conn, load_migrations())
        closed = conn.execute(
            "UPDATE call_log SET outcome = 'interrupted' WHERE outcome = 'pending'"
        ).rowcount
        if closed:
            log.warning("closed %d call rows left pending by an earlier run", closed)
        return conn

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T | None:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, fn, self._conn)
        except sqlite3.Error as exc:
            self.write_failures += 1
            log.error("store write failed (%d so far): %s", self.write_failures, exc)
            return None

    async def call_started(self, start: CallStart) -> int | None:
        def insert(conn: sqlite3.Connection) -> int:
            cur = conn.execute(
                "INSERT INTO call_log (request_id, endpoint, model_asked, stream, received_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (
                    start.request_id,
                    start.endpoint,
                    start.model_asked,
                    int(start.stream),
                    start.received_at,
                ),
            )
            return int(cur.lastrowid or 0)

        return await self._run(insert)

    async def call_updated(self, call_id: int | None, **values: Any) -> None:
        if call_id is None:
            return
        unknown = set(values) - _CALL_COLUMNS
        if unknown:
            raise ValueError(f"not call_log columns: {sorted(unknown)}")
        if "evicted" in values and not isinstance(values["evicted"], str | None):
            values["evicted"] = json.dumps(values["evicted"])
        assignments = ", ".join(f"{column} = ?" for column in values)

        def update(conn: sqlite3.Connection) -> None:
            conn.execute(
                f"UPDATE call_log SET {assignments} WHERE id = ?",  # noqa: S608 - whitelisted
                (*values.values(), call_id),
            )

        await self._run(update)

    async def recent_calls(self, limit: int = 100) -> list[dict[str, Any]]:
        def select(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            rows = conn.execute("SELECT * FROM call_log ORDER BY id DESC LIMIT ?", (limit,))
            return [dict(row) for row in rows]

        return await self._run(select) or []

    def close(self) -> None:
        def shut(conn: sqlite3.Connection) -> None:
            conn.execute(
                "UPDATE call_log SET outcome = 'interrupted', last_byte_at = ?"
                " WHERE outcome = 'pending'",
                (time.time(),),
            )
            conn.close()

        try:
            self._executor.submit(shut, self._conn).result(timeout=10)
        except Exception as exc:
            log.error("closing the store: %s", exc)
        self._executor.shutdown(wait=True)
