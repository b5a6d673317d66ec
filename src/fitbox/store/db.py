"""The store: one SQLite file, one writer thread that owns the connection (store/writer.py).
This module keeps the call log (and, in memory, the rows of the latest calls, put back into
a file made while they run); the file itself is opened, watched and replaced in
store_file.py, the box's history rows are in history.py, its measured facts in
fact_rows.py, the queue they all write through in queue.py.

Callers never wait for a write: they enqueue it and go on; reads are awaited. A failed
write (disk full, a damaged file) is counted and logged; it never fails the call that
caused it, and a write a full drive refused is kept and written when room returns.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import sqlite3
import threading
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
from fitbox.store.failures import StoreUnavailable, drive_free
from fitbox.store.history import History
from fitbox.store.queue import CURSOR_TABLES, READING_TABLES
from fitbox.store.sqlite_file import connect
from fitbox.store.store_file import interrupt_pending, open_store
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
CALLS_REMEMBERED = 1024  # ended calls whose rows are kept in memory (running ones all are)
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
        "files",  # a task call's inputs and outputs: role, name, bytes, sha256 (JSON)
        "audio_in_s",
        "audio_out_s",
        "image_pixels",
    }
)


@dataclass(frozen=True)
class CentralKey:
    """Which central key a call through the central was made with (never its secret)."""

    key_id: str
    name: str


@dataclass
class CallStart:
    request_id: str
    endpoint: str
    model_asked: str | None
    stream: bool
    received_at: float
    central_key: str | None = None  # the central key a call through the central came with
    central_key_name: str | None = None


class Store(History, FactRows):
    """The box's store: every write queued to one writer, every read run in order with them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        opened = open_store(path)
        if opened.closed:
            log.warning("closed %d call rows left pending by an earlier run", opened.closed)
        self.set_aside = opened.set_aside  # where a damaged store file was moved, if one was
        self.new = opened.new  # no store file was there at this start
        conn = opened.conn
        row = conn.execute("SELECT COALESCE(MAX(id), 0) FROM call_log").fetchone()
        self._next_call_id = int(row[0]) + 1
        counter = int(conn.execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()[0])
        # the rows of the latest calls as the box knows them, to put back into a file made
        # while they run (store/store_file.py): their end must land somewhere
        self._calls: collections.OrderedDict[int, dict[str, Any]] = collections.OrderedDict()
        self._calls_lock = threading.Lock()
        self.lost_at_start: str | None = None  # what this start found missing (box_key.py)
        self._writer = Writer(conn, path, counter, opened.id)
        self._writer.on_new_file.append(self._put_calls_back)

    def health(self) -> dict[str, Any]:
        state = self._writer.state
        aside = state.set_aside or self.set_aside
        return {
            "path": str(self.path),
            "write_failures": state.failures,
            "writes_waiting": state.waiting,
            "writes_lost": state.lost,
            "writing": state.failing is None,
            "last_write_error": state.failing,
            "damaged_file_set_aside": str(aside) if aside else None,
            "file_problem": state.file_problem,
            "lost_at_start": self.lost_at_start,
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
        if state.file_problem is not None:
            found.append(
                f"{state.file_problem}. Find what touched {self.path.parent} (only fitbox "
                "may write there); a restart clears this"
            )
        if (free is None or free >= FULL_BELOW) and state.failing is not None:
            locked = state.failing_code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
            fix = (
                "Another connection holds its write lock: end that transaction (an "
                "operator's sqlite3, a backup tool)"
                if locked
                else "Check the drive holding it"
            )
            found.append(f"the store {self.path} cannot write ({state.failing}): {held}. {fix}")
        return found

    # -- the call log ------------------------------------------------------------

    def call_started(self, start: CallStart) -> int:
        """Queue the call's row; returns its id at once (ids are handed out here)."""
        call_id = self._next_call_id
        self._next_call_id += 1

        row = {
            "request_id": start.request_id,
            "endpoint": start.endpoint,
            "model_asked": start.model_asked,
            "stream": int(start.stream),
            "received_at": start.received_at,
            "central_key": start.central_key,
            "central_key_name": start.central_key_name,
        }

        def insert(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO call_log (id, request_id, endpoint, model_asked, stream, "
                "received_at, central_key, central_key_name) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (call_id, *row.values()),
            )
            self._event(conn, "call", "call_log", call_id)

        self._remember(call_id, row)
        self._submit(insert)
        return call_id

    def _remember(self, call_id: int, values: dict[str, Any]) -> None:
        with self._calls_lock:
            known = self._calls.get(call_id)
            if known is None and "request_id" not in values:
                return  # a call ended long ago: its row is the file's alone
            self._calls[call_id] = {**(known or {}), **values}
            if len(self._calls) > CALLS_REMEMBERED:  # forget the older half of the ended
                ended = [
                    k
                    for k, row in self._calls.items()
                    if row.get("outcome", "pending") != "pending"
                ]
                for old in ended[: len(ended) // 2 + 1]:
                    del self._calls[old]

    def _put_calls_back(self, conn: sqlite3.Connection) -> None:
        """Into a new store file (the writer's thread): the rows of the calls the box knows
        of, as it knows them, so a running call's end lands in the file it writes to."""
        with self._calls_lock:
            calls = [(call_id, dict(row)) for call_id, row in self._calls.items()]
        for call_id, row in calls:
            names = ", ".join(row)
            marks = ", ".join("?" * len(row))
            assignments = ", ".join(f"{name} = ?" for name in row)
            conn.execute(  # the columns are call_log's own (call_started, _CALL_COLUMNS)
                f"INSERT OR IGNORE INTO call_log (id, {names}) VALUES (?, {marks})",  # noqa: S608
                (call_id, *row.values()),
            )
            conn.execute(
                f"UPDATE call_log SET {assignments} WHERE id = ?",  # noqa: S608
                (*row.values(), call_id),
            )
            self._event(conn, "call", "call_log", call_id)

    def call_updated(self, call_id: int, **values: Any) -> None:
        unknown = set(values) - _CALL_COLUMNS
        if unknown:
            raise ValueError(f"not call_log columns: {sorted(unknown)}")
        for column in ("evicted", "devices", "tensor_split", "cores", "files"):
            if column in values and not isinstance(values[column], str | None):
                values[column] = json.dumps(values[column])
        assignments = ", ".join(f"{column} = ?" for column in values)
        sql = f"UPDATE call_log SET {assignments} WHERE id = ?"  # noqa: S608 - whitelisted
        params = (*values.values(), call_id)
        self._remember(call_id, values)

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
        self._submit(lambda conn: interrupt_pending(conn, now))
        self._writer.stop()
        self._writer.closed()
