"""The store: one SQLite file, one writer thread that owns the connection (store/writer.py).
This module opens the file (setting a damaged one aside) and keeps the call log; the box's
history rows are in history.py, its measured facts in fact_rows.py, the queue they all
write through in queue.py.

Callers never wait for a write: they enqueue it and go on; reads are awaited. A failed
write (disk full, a damaged file) is counted and logged; it never fails the call that
caused it, and a write a full drive refused is kept and written when room returns.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fitbox.store.fact_rows import FactRows
from fitbox.store.facts import (
    MeasuredFootprint,
    MeasuredSpeed,
    read_measured,
)
from fitbox.store.failures import (
    DAMAGE_CODES,
    StoreUnavailable,
    drive_free,
    is_resource_failure,
    primary_code,
)
from fitbox.store.history import History
from fitbox.store.migrations import load_migrations, migrate
from fitbox.store.queue import CURSOR_TABLES, READING_TABLES
from fitbox.store.sqlite_file import connect
from fitbox.store.writer import Writer
from fitbox.units import format_bytes

# the fact types and read_measured are re-exported: callers import them from here
__all__ = [
    "CURSOR_TABLES",
    "READING_TABLES",
    "CallStart",
    "MeasuredFootprint",
    "MeasuredSpeed",
    "Store",
    "StoreUnavailable",
    "connect",
    "read_measured",
]
log = logging.getLogger(__name__)
FULL_BELOW = 1024 * 1024  # a drive with less than this free is full to the store (a WAL frame
# is 4 KiB, but a checkpoint, a migration or a log line each want more)

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
        "rung",
        "type_k",
        "type_v",
        "devices",
        "tensor_split",
        "cores",
        "cache_tokens",
        "prompt_ms",
        "prompt_per_token_ms",
        "decode_ms",
        "decode_per_token_ms",
    }
)


def _interrupt_pending(conn: sqlite3.Connection, ended_at: float | None) -> int:
    """Close call rows left pending as interrupted, each stamped with an event as every
    change of a cursor table is: a central's mirror then replays its final form (an
    unstamped change keeps the old seq, below the mirror's cursor, and is never seen)."""
    now = time.time()
    pending = [int(r[0]) for r in conn.execute("SELECT id FROM call_log WHERE outcome = 'pending'")]
    for row_id in pending:
        seq = conn.execute(
            "INSERT INTO events (at, kind, tbl, row_id) VALUES (?, 'interrupted', 'call_log', ?)",
            (now, row_id),
        ).lastrowid
        conn.execute(
            "UPDATE call_log SET outcome = 'interrupted', seq = ?,"
            " last_byte_at = COALESCE(?, last_byte_at) WHERE id = ?",
            (seq, ended_at, row_id),
        )
    return len(pending)


@dataclass
class CallStart:
    request_id: str
    endpoint: str
    model_asked: str | None
    stream: bool
    received_at: float


class Store(History, FactRows):
    """The box's store: every write queued to one writer, every read run in order with them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.set_aside: Path | None = None  # where a damaged store file was moved, if one was
        conn = self._open(path)
        row = conn.execute("SELECT COALESCE(MAX(id), 0) FROM call_log").fetchone()
        self._next_call_id = int(row[0]) + 1
        counter = int(conn.execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()[0])
        self._conn = conn
        self._writer = Writer(conn, path, counter)

    def _open(self, path: Path) -> sqlite3.Connection:
        """Open, check and migrate the store. Raises :class:`StoreUnavailable` when the
        drive, not the file, is the problem (full, failing, not ours): nothing is moved."""
        try:
            conn = self._open_checked(path)
            try:
                migrate(conn, load_migrations())
                closed = _interrupt_pending(conn, None)
            except BaseException:
                conn.close()
                raise
        except (sqlite3.Error, OSError) as exc:
            if isinstance(exc, StoreUnavailable) or not is_resource_failure(exc):
                raise
            raise StoreUnavailable(path, "open", exc) from exc
        if closed:
            log.warning("closed %d call rows left pending by an earlier run", closed)
        return conn

    def _open_checked(self, path: Path) -> sqlite3.Connection:
        """A file that fails its check when it *could* be read is damaged: it is moved aside
        and a new one started, so damage costs the history, never the service. An error
        reading it (full drive, I/O error, permission) is not damage and is raised."""
        try:
            conn = connect(path)
        except sqlite3.DatabaseError as exc:
            if primary_code(exc) not in DAMAGE_CODES:  # "file is not a database", malformed
                raise
            return self._set_aside(path, str(exc))
        try:
            result = conn.execute("PRAGMA quick_check").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            conn.close()
            if primary_code(exc) not in DAMAGE_CODES:
                raise
            return self._set_aside(path, str(exc))
        if result == "ok":
            return conn
        conn.close()
        return self._set_aside(path, str(result))

    def _set_aside(self, path: Path, problem: str) -> sqlite3.Connection:
        stamp = time.strftime("%Y%m%dT%H%M%S")
        self.set_aside = path.with_name(f"{path.name}.damaged-{stamp}")
        for suffix in ("", "-wal", "-shm"):
            source = Path(f"{path}{suffix}")
            if source.exists():
                os.replace(source, Path(f"{self.set_aside}{suffix}"))
        log.error(
            "store %s failed its check (%s); moved it to %s and started a new one",
            path,
            problem,
            self.set_aside,
        )
        return connect(path)

    def health(self) -> dict[str, Any]:
        state = self._writer.state
        return {
            "path": str(self.path),
            "write_failures": state.failures,
            "writes_waiting": state.waiting,
            "writes_lost": state.lost,
            "writing": state.failing is None,
            "last_write_error": state.failing,
            "damaged_file_set_aside": str(self.set_aside) if self.set_aside else None,
        }

    def problems(self) -> list[str]:
        """What an operator must fix for the store to keep everything: a drive that is full
        (whatever SQLite says yet), or writes refused for any other reason (a failing drive,
        a write cap that is not the drive's: SQLITE_FULL with room on it)."""
        state, found = self._writer.state, []
        free = drive_free(self.path)
        held = (
            f"{state.waiting} writes wait in memory and land when it has room, "
            f"{state.lost} were lost"
            if state.failing
            else "writes still land"
        )
        if free is not None and free < FULL_BELOW:
            found.append(
                f"the drive holding {self.path.parent} is full ({format_bytes(free)} "
                f"free): {held}; keys and settings cannot change and engine logs lose "
                "lines. Free space on it"
            )
        elif state.failing is not None:
            found.append(
                f"the store {self.path} cannot write ({state.failing}): {held}. "
                "Check the drive holding it"
            )
        return found

    # -- the call log ------------------------------------------------------------

    def call_started(self, start: CallStart) -> int:
        """Queue the call's row; returns its id at once (ids are handed out here)."""
        call_id = self._next_call_id
        self._next_call_id += 1

        def insert(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO call_log (id, request_id, endpoint, model_asked, stream, "
                "received_at) VALUES (?, ?, ?, ?, ?, ?)",
                (
                    call_id,
                    start.request_id,
                    start.endpoint,
                    start.model_asked,
                    int(start.stream),
                    start.received_at,
                ),
            )
            self._event(conn, "call", "call_log", call_id)

        self._submit(insert)
        return call_id

    def call_updated(self, call_id: int, **values: Any) -> None:
        unknown = set(values) - _CALL_COLUMNS
        if unknown:
            raise ValueError(f"not call_log columns: {sorted(unknown)}")
        for column in ("evicted", "devices", "tensor_split", "cores"):
            if column in values and not isinstance(values[column], str | None):
                values[column] = json.dumps(values[column])
        assignments = ", ".join(f"{column} = ?" for column in values)
        sql = f"UPDATE call_log SET {assignments} WHERE id = ?"  # noqa: S608 - whitelisted
        params = (*values.values(), call_id)

        def update(conn: sqlite3.Connection) -> None:
            if conn.execute(sql, params).rowcount:
                self._event(conn, "call", "call_log", call_id)

        self._submit(update)

    async def recent_calls(self, limit: int = 100) -> list[dict[str, Any]]:
        def select(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            rows = conn.execute("SELECT * FROM call_log ORDER BY id DESC LIMIT ?", (limit,))
            return [dict(row) for row in rows]

        future = self._submit(select, wait=True)
        assert future is not None
        try:
            result: list[dict[str, Any]] = await asyncio.wrap_future(future)
        except sqlite3.Error:
            return []
        return result

    def box_id(self) -> str | None:
        """The box's persistent id (made at the first start, then read; see 0020). None
        when a store that cannot write (a full drive) has none yet: the box still serves,
        and a later start makes it."""

        def read(conn: sqlite3.Connection) -> str | None:
            row = conn.execute("SELECT box_id FROM box_identity").fetchone()
            return str(row[0]) if row else None

        def read_or_make(conn: sqlite3.Connection) -> str | None:
            conn.execute(
                "INSERT OR IGNORE INTO box_identity (only_row, box_id, created_at) "
                "VALUES (1, ?, ?)",
                (str(uuid.uuid4()), time.time()),
            )
            return read(conn)

        try:
            found: str | None = self.run(read, timeout=10) or self.run(read_or_make, timeout=10)
        except (sqlite3.Error, TimeoutError) as exc:
            log.warning("the box id cannot be read or made (%s); /health reports none", exc)
            return None
        return found

    def close(self) -> None:
        """Close rows still pending as interrupted, drain the queue, stop the writer."""
        now = time.time()
        self._submit(lambda conn: _interrupt_pending(conn, now))
        self._writer.stop()
        self._conn.close()
