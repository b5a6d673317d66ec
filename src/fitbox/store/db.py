"""The store: one SQLite file, one writer thread that owns the connection.

Callers never wait for a write: they enqueue it and go on. The writer wakes at most once
per ``LINGER_S``, drains what has queued up and commits it as one transaction (group
commit), so a busy box pays one commit and one thread wake-up for many call-log updates
instead of a GIL hand-off per write; ``hurry()`` cuts the linger short for a caller that
waits on a ``barrier()`` (a call's row, before its first byte leaves). Reads go through the
same thread and are awaited.
A failed write (disk full, a damaged file) is counted and logged; it never fails the call
that caused it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fitbox.store import facts
from fitbox.store.facts import (
    MeasuredFootprint,
    MeasuredSpeed,
    RefusedWindowKey,
    read_measured,
)
from fitbox.store.migrations import load_migrations, migrate

# the fact types and read_measured are re-exported: callers import them from here
__all__ = ["CURSOR_TABLES", "READING_TABLES", "CallStart", "MeasuredFootprint",
           "MeasuredSpeed", "Store", "connect", "read_measured"]  # fmt: skip
log = logging.getLogger(__name__)
LINGER_S = 0.02  # how long the writer lets work pile up after a wake-up

_CALL_COLUMNS = frozenset(
    {
        "artifact", "outcome", "http_status", "error_code", "device", "window", "evicted",
        "admitted_at", "load_start_at", "load_ready_at", "first_byte_at", "last_byte_at",
        "prompt_tokens", "completion_tokens", "rung", "type_k", "type_v", "devices",
        "tensor_split", "cores", "cache_tokens", "prompt_ms", "prompt_per_token_ms", "decode_ms",
        "decode_per_token_ms",
    }
)  # fmt: skip


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


CURSOR_TABLES = ("call_log", "operator_actions", "measured_footprints", "children",
                 "measured_speeds", "evictions", "pulls", "refused_windows",
                 "gpu_processes")  # fmt: skip
READING_TABLES = ("resource_log",)  # replayed by id: readings carry no event seq


Job = Callable[[sqlite3.Connection], Any]


@dataclass
class _Queued:
    job: Job
    future: Future[Any] | None = None


_STOP = _Queued(lambda conn: None)


class Store:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.write_failures = 0
        self.set_aside: Path | None = None  # where a damaged store file was moved, if one was
        self._conn = self._open_checked(path)
        migrate(self._conn, load_migrations())
        closed = self._conn.execute(
            "UPDATE call_log SET outcome = 'interrupted' WHERE outcome = 'pending'"
        ).rowcount
        if closed:
            log.warning("closed %d call rows left pending by an earlier run", closed)
        row = self._conn.execute("SELECT COALESCE(MAX(id), 0) FROM call_log").fetchone()
        self._next_call_id = int(row[0]) + 1
        self.counter = int(self._conn.execute("SELECT COALESCE(MAX(id), 0) FROM events")
                           .fetchone()[0])  # fmt: skip
        self._batch_counter = self.counter
        self._listeners: list[Callable[[int], None]] = []
        self._queue: collections.deque[_Queued] = collections.deque()  # appends are atomic
        self._wake = threading.Event()
        self._hurry = threading.Event()  # someone waits on a commit: skip the linger
        self._thread = threading.Thread(target=self._write_loop, name="fitbox-store", daemon=True)
        self._thread.start()

    def _open_checked(self, path: Path) -> sqlite3.Connection:
        """Open the store; a file that fails its check is moved aside and started afresh, so
        a damaged disk file costs the history, never the service."""
        problem = None
        try:
            conn = connect(path)
            result = conn.execute("PRAGMA quick_check").fetchone()[0]
            if result == "ok":
                return conn
            problem = str(result)
            conn.close()
        except sqlite3.DatabaseError as exc:  # "file is not a database", malformed, ...
            problem = str(exc)
        stamp = time.strftime("%Y%m%dT%H%M%S")
        self.set_aside = path.with_name(f"{path.name}.damaged-{stamp}")
        for suffix in ("", "-wal", "-shm"):
            source = Path(f"{path}{suffix}")
            if source.exists():
                os.replace(source, Path(f"{self.set_aside}{suffix}"))
        log.error("store %s failed its check (%s); moved it to %s and started a new one",
                  path, problem, self.set_aside)  # fmt: skip
        return connect(path)

    def health(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "write_failures": self.write_failures,
            "damaged_file_set_aside": str(self.set_aside) if self.set_aside else None,
        }

    # -- the writer thread -------------------------------------------------------

    def _write_loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()  # before draining: a later submit wakes us again
            self._hurry.wait(LINGER_S)
            self._hurry.clear()  # before draining: what is queued now goes in this batch
            batch = []
            while self._queue:
                batch.append(self._queue.popleft())
            stop = any(item is _STOP for item in batch)
            self._apply([item for item in batch if item is not _STOP])
            if stop:
                return

    def _apply(self, batch: list[_Queued]) -> None:
        """Run a batch in one transaction. A statement that fails is counted and the rest go
        on; if the failure rolled the whole transaction back (SQLITE_FULL does), the writes
        it took with it are counted too and a new transaction carries on."""
        if not batch:
            return
        results: list[tuple[_Queued, Any, BaseException | None]] = []
        try:
            self._conn.execute("BEGIN")
            for item in batch:
                try:
                    results.append((item, item.job(self._conn), None))
                except Exception as exc:  # a job's own error is its caller's, never the writer's
                    if isinstance(exc, sqlite3.Error):
                        self._failed(exc)
                    results.append((item, None, exc))
                    if not self._conn.in_transaction:
                        results = self._lost(results, exc)
                        self._batch_counter = int(self._conn.execute(
                            "SELECT COALESCE(MAX(id), 0) FROM events").fetchone()[0])  # fmt: skip
                        self._conn.execute("BEGIN")
            self._conn.execute("COMMIT")
        except sqlite3.Error as exc:  # the commit itself failed: nothing in it landed
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            results = self._lost(results, exc)
            self._batch_counter = int(self._conn.execute(
                "SELECT COALESCE(MAX(id), 0) FROM events").fetchone()[0])  # fmt: skip
        if self._batch_counter != self.counter:
            self.counter = self._batch_counter
            for listener in self._listeners:
                listener(self.counter)
        for item, value, error in results:
            if item.future is not None:
                if error is None:
                    item.future.set_result(value)
                else:
                    item.future.set_exception(error)

    def _lost(
        self, results: list[tuple[_Queued, Any, BaseException | None]], exc: BaseException
    ) -> list[tuple[_Queued, Any, BaseException | None]]:
        """Writes that had succeeded inside a transaction that was then rolled back."""
        landed = [r for r in results if r[2] is None]
        if landed:
            self._failed(exc, count=len(landed))
        return [(item, None, error or exc) for item, _, error in results]

    def _event(self, conn: sqlite3.Connection, kind: str, table: str, row_id: int) -> None:
        """Record an event for a row of a cursor table and stamp the row with it."""
        assert table in CURSOR_TABLES
        seq = conn.execute(
            "INSERT INTO events (at, kind, tbl, row_id) VALUES (?, ?, ?, ?)",
            (time.time(), kind, table, row_id),
        ).lastrowid
        conn.execute(f"UPDATE {table} SET seq = ? WHERE id = ?", (seq, row_id))  # noqa: S608
        self._batch_counter = max(self._batch_counter, int(seq or 0))

    def on_change(self, listener: Callable[[int], None]) -> None:
        """Call ``listener(counter)`` (from the writer thread) after each commit that moved it."""
        self._listeners.append(listener)

    def _failed(self, exc: BaseException, count: int = 1) -> None:
        self.write_failures += count
        log.error("store write failed (%d so far): %s", self.write_failures, exc)

    def _submit(self, job: Job, wait: bool = False) -> Future[Any] | None:
        future: Future[Any] | None = Future() if wait else None
        self._queue.append(_Queued(job, future))
        if not self._wake.is_set():
            self._wake.set()
        return future

    # -- the call log ------------------------------------------------------------

    def call_started(self, start: CallStart) -> int:
        """Queue the call's row; returns its id at once (ids are handed out here)."""
        call_id = self._next_call_id
        self._next_call_id += 1

        def insert(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO call_log (id, request_id, endpoint, model_asked, stream, "
                "received_at) VALUES (?, ?, ?, ?, ?, ?)",
                (call_id, start.request_id, start.endpoint, start.model_asked,
                 int(start.stream), start.received_at),
            )  # fmt: skip
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

    def child_started(
        self, pid: int, create_time: float, port: int, artifact: str, argv: list[str]
    ) -> None:
        now = time.time()
        self._submit(lambda conn: self._insert(conn, "child", "children",
            "INSERT INTO children (pid, create_time, port, artifact, argv, started_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (pid, create_time, port, artifact, json.dumps(argv), now)))  # fmt: skip

    def child_ended(self, pid: int, create_time: float, how: str) -> None:
        now = time.time()

        def end(conn: sqlite3.Connection) -> None:
            for (row_id,) in conn.execute(
                "SELECT id FROM children WHERE pid = ? AND create_time = ? AND ended_at IS NULL",
                (pid, create_time)).fetchall():  # fmt: skip
                self._ended(conn, row_id, how, now)

        self._submit(end)

    def child_row_ended(self, row_id: int, how: str) -> None:
        now = time.time()
        self._submit(lambda conn: self._ended(conn, row_id, how, now))

    def _ended(self, conn: sqlite3.Connection, row_id: int, how: str, now: float) -> None:
        conn.execute("UPDATE children SET ended_at = ?, ended_how = ? WHERE id = ?",
                     (now, how, row_id))  # fmt: skip
        self._event(conn, "child", "children", row_id)

    def _insert(
        self, conn: sqlite3.Connection, kind: str, table: str, sql: str, params: tuple[Any, ...]
    ) -> int:
        row_id = int(conn.execute(sql, params).lastrowid or 0)
        self._event(conn, kind, table, row_id)
        return row_id

    def open_children(self) -> list[tuple[int, int, float, str]]:
        """(row id, pid, create_time, argv0) of children never recorded as ended."""

        def select(conn: sqlite3.Connection) -> list[tuple[int, int, float, str]]:
            rows = conn.execute(
                "SELECT id, pid, create_time, argv FROM children WHERE ended_at IS NULL"
            )
            return [(r[0], r[1], r[2], (json.loads(r[3]) or [""])[0]) for r in rows]

        result: list[tuple[int, int, float, str]] = self.run(select)
        return result  # fmt: skip

    def operator_action(
        self,
        action: str,
        target: str | None,
        origin: str | None,
        key_id: str | None,
        outcome: str,
        detail: str | None = None,
    ) -> None:
        now = time.time()
        self._submit(lambda conn: self._insert(conn, "operator", "operator_actions",
            "INSERT INTO operator_actions (at, action, target, origin, key_id, outcome, detail)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)", (now, action, target, origin, key_id, outcome, detail)
        ))  # fmt: skip

    def footprint_measured(self, measured: MeasuredFootprint) -> None:
        self._submit(lambda conn: self._event(conn, "fact", "measured_footprints",
                                              facts.insert_footprint(conn, measured)))  # fmt: skip

    def readings(self, rows: list[tuple[Any, ...]]) -> None:
        """Sensor readings (at, device, simulated, total, free, fitbox, busy %, swap free):
        stored without an event, so the change counter does not move."""
        sql = (
            "INSERT INTO resource_log (at, device, simulated, total_bytes, free_bytes, "
            "fitbox_bytes, busy_percent, swap_free_bytes) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self._submit(lambda conn: conn.executemany(sql, rows))

    def gpu_process(self, device: str, pid: int, change: str, used: int | None, ours: bool,
                    simulated: bool) -> None:  # fmt: skip
        now = time.time()
        self._submit(lambda conn: self._insert(conn, "gpu-process", "gpu_processes",
            "INSERT INTO gpu_processes (at, device, pid, change, used_bytes, ours, simulated) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)", (now, device, pid, change, used, int(ours),
                                             int(simulated))))  # fmt: skip

    def forget_readings(self, older_than: float) -> None:
        self._submit(lambda conn: conn.execute("DELETE FROM resource_log WHERE at < ?",
                                               (older_than,)))  # fmt: skip

    def evicted(
        self, model: str, artifact: str, devices: dict[str, int], reason: str,
        for_model: str | None = None, call_id: int | None = None,
        idle_seconds: float | None = None,
    ) -> None:  # fmt: skip
        now = time.time()
        self._submit(lambda conn: self._insert(conn, "eviction", "evictions",
            "INSERT INTO evictions (at, model, artifact, devices, reason, for_model, call_id, "
            "idle_seconds) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (now, model, artifact, json.dumps(devices), reason, for_model, call_id,
             idle_seconds)))  # fmt: skip

    def pulled(self, source: str, path: str | None, size: int | None, verified: bool,
               outcome: str, detail: str | None = None) -> None:  # fmt: skip
        now = time.time()
        self._submit(lambda conn: self._insert(conn, "pull", "pulls",
            "INSERT INTO pulls (at, source, path, bytes, verified, outcome, detail) VALUES "
            "(?, ?, ?, ?, ?, ?, ?)",
            (now, source, path, size, int(verified), outcome, detail)))  # fmt: skip

    def window_refused(self, artifact: Path, placement: str, window: int, type_k: str,
                       type_v: str, detail: str | None, call_id: int | None) -> None:  # fmt: skip
        try:
            stat = artifact.stat()
        except OSError:
            return
        key = (str(artifact), stat.st_size, stat.st_mtime_ns, placement, window)
        now = time.time()
        self._submit(lambda conn: self._event(conn, "fact", "refused_windows",
            facts.insert_refused_window(conn, key, type_k, type_v, detail, call_id, now),
        ))  # fmt: skip

    def refused_windows(self) -> list[RefusedWindowKey]:
        """(artifact, size, mtime_ns, placement, window) of every refused window."""
        try:
            result: list[RefusedWindowKey] = self.run(facts.refused_windows)
        except sqlite3.Error:
            return []
        return result

    def speed_measured(self, speed: MeasuredSpeed) -> None:
        self._submit(lambda conn: self._event(conn, "fact", "measured_speeds",
                                              facts.insert_speed(conn, speed)))  # fmt: skip

    def recent_speeds(self) -> list[MeasuredSpeed]:
        """The last 20 speeds of every (file, rung), oldest first (read once, at start)."""
        try:
            result: list[MeasuredSpeed] = self.run(facts.recent_speeds)
        except sqlite3.Error:
            return []
        return result

    def measured_footprints(self) -> list[MeasuredFootprint]:
        """The newest measurement of every placement key (read once, at start)."""
        future = self._submit(facts.latest_footprints, wait=True)
        assert future is not None
        try:
            result: list[MeasuredFootprint] = future.result(timeout=30)
        except sqlite3.Error:
            return []
        return result

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

    def run(self, job: Job, timeout: float = 30.0) -> Any:
        """Run ``job`` on the writer's connection, in order with queued writes; its result."""
        future = self._submit(job, wait=True)
        assert future is not None
        return future.result(timeout=timeout)

    def barrier(self) -> Future[Any]:
        """A future set once everything queued before it is committed (or has failed)."""
        future = self._submit(lambda conn: None, wait=True)
        assert future is not None
        return future

    def hurry(self) -> None:
        """Commit what is queued without lingering: a caller waits on a ``barrier()``."""
        self._hurry.set()
        self._wake.set()

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until everything queued so far is written (or has failed)."""
        future = self._submit(lambda conn: None, wait=True)
        assert future is not None
        with contextlib.suppress(sqlite3.Error):  # a barrier: failures are counted, not raised
            future.result(timeout=timeout)

    def close(self) -> None:
        """Close rows still pending as interrupted, drain the queue, stop the writer."""
        now = time.time()
        self._submit(
            lambda conn: conn.execute(
                "UPDATE call_log SET outcome = 'interrupted', last_byte_at = ?"
                " WHERE outcome = 'pending'",
                (now,),
            )
        )
        self._queue.append(_STOP)
        self._wake.set()
        self._thread.join(timeout=30)
        self._conn.close()
