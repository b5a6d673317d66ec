"""The store: one SQLite file, one writer thread that owns the connection (store/writer.py).

Callers never wait for a write: they enqueue it and go on; reads are awaited. A failed
write (disk full, a damaged file) is counted and logged; it never fails the call that
caused it, and a write a full drive refused is kept and written when room returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sqlite3
import time
import uuid
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
from fitbox.store.failures import (
    DAMAGE_CODES,
    StoreUnavailable,
    drive_free,
    is_resource_failure,
    primary_code,
)
from fitbox.store.migrations import load_migrations, migrate
from fitbox.store.sqlite_file import connect
from fitbox.store.writer import Job, Writer
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


@dataclass
class CallStart:
    request_id: str
    endpoint: str
    model_asked: str | None
    stream: bool
    received_at: float


CURSOR_TABLES = (
    "call_log",
    "operator_actions",
    "measured_footprints",
    "children",
    "measured_speeds",
    "evictions",
    "pulls",
    "refused_windows",
    "gpu_processes",
    "scout_findings",
)
READING_TABLES = ("resource_log",)  # replayed by id: readings carry no event seq


class Store:
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
                closed = conn.execute(
                    "UPDATE call_log SET outcome = 'interrupted' WHERE outcome = 'pending'"
                ).rowcount
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

    @property
    def write_failures(self) -> int:
        return self._writer.state.failures

    @property
    def counter(self) -> int:
        """The change counter: the newest committed event's id."""
        return self._writer.counter

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

    # -- the writer thread -------------------------------------------------------

    def _event(self, conn: sqlite3.Connection, kind: str, table: str, row_id: int) -> None:
        """Record an event for a row of a cursor table and stamp the row with it."""
        assert table in CURSOR_TABLES
        seq = conn.execute(
            "INSERT INTO events (at, kind, tbl, row_id) VALUES (?, ?, ?, ?)",
            (time.time(), kind, table, row_id),
        ).lastrowid
        conn.execute(f"UPDATE {table} SET seq = ? WHERE id = ?", (seq, row_id))  # noqa: S608
        self._writer.batch_counter = max(self._writer.batch_counter, int(seq or 0))

    def on_change(self, listener: Callable[[int], None]) -> None:
        """Call ``listener(counter)`` (from the writer thread) after each commit that moved it."""
        self._writer.listeners.append(listener)

    def _submit(
        self, job: Job, wait: bool = False, keep: bool = True, lazy: bool = False
    ) -> Future[Any] | None:
        return self._writer.submit(job, wait, keep, lazy)

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

    def child_started(
        self, pid: int, create_time: float, port: int, artifact: str, argv: list[str]
    ) -> None:
        now = time.time()
        self._submit(
            lambda conn: self._insert(
                conn,
                "child",
                "children",
                "INSERT INTO children (pid, create_time, port, artifact, argv, started_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (pid, create_time, port, artifact, json.dumps(argv), now),
            )
        )

    def child_ended(self, pid: int, create_time: float, how: str) -> None:
        now = time.time()

        def end(conn: sqlite3.Connection) -> None:
            for (row_id,) in conn.execute(
                "SELECT id FROM children WHERE pid = ? AND create_time = ? AND ended_at IS NULL",
                (pid, create_time),
            ).fetchall():
                self._ended(conn, row_id, how, now)

        self._submit(end)

    def child_row_ended(self, row_id: int, how: str) -> None:
        now = time.time()
        self._submit(lambda conn: self._ended(conn, row_id, how, now))

    def _ended(self, conn: sqlite3.Connection, row_id: int, how: str, now: float) -> None:
        conn.execute(
            "UPDATE children SET ended_at = ?, ended_how = ? WHERE id = ?", (now, how, row_id)
        )
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
        return result

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
        self._submit(
            lambda conn: self._insert(
                conn,
                "operator",
                "operator_actions",
                "INSERT INTO operator_actions (at, action, target, origin, key_id, outcome, detail)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (now, action, target, origin, key_id, outcome, detail),
            )
        )

    def footprint_measured(self, measured: MeasuredFootprint) -> None:
        self._submit(
            lambda conn: self._event(
                conn, "fact", "measured_footprints", facts.insert_footprint(conn, measured)
            )
        )

    def footprint_imported(self, measured: MeasuredFootprint) -> None:
        """A footprint another box measured, with its origin; an offer taken before: no row."""
        self._imported("measured_footprints", lambda conn: facts.import_footprint(conn, measured))

    def window_imported(self, window: facts.ImportedWindow) -> None:
        """A window another box's load was refused at; an offer taken before: no row."""
        self._imported("refused_windows", lambda conn: facts.import_refused_window(conn, window))

    def speed_imported(self, speed: MeasuredSpeed) -> None:
        """A speed another box measured, with its origin; an offer taken before: no row."""
        self._imported("measured_speeds", lambda conn: facts.import_speed(conn, speed))

    def _imported(self, table: str, insert: Callable[[sqlite3.Connection], int | None]) -> None:
        def job(conn: sqlite3.Connection) -> None:
            if (row_id := insert(conn)) is not None:
                self._event(conn, "fact", table, row_id)

        self._submit(job)

    def readings(self, rows: list[tuple[Any, ...]]) -> None:
        """Sensor readings (at, device, simulated, total, free, fitbox, busy %, swap free):
        stored without an event, so the change counter does not move; lazily (writer.py
        ``LAZY_S``): a read still sees every reading queued before it."""
        sql = (
            "INSERT INTO resource_log (at, device, simulated, total_bytes, free_bytes, "
            "fitbox_bytes, busy_percent, swap_free_bytes) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self._submit(lambda conn: conn.executemany(sql, rows), keep=False, lazy=True)

    def gpu_process(
        self, device: str, pid: int, change: str, used: int | None, ours: bool, simulated: bool
    ) -> None:
        now = time.time()
        self._submit(
            lambda conn: self._insert(
                conn,
                "gpu-process",
                "gpu_processes",
                "INSERT INTO gpu_processes (at, device, pid, change, used_bytes, ours, simulated) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (now, device, pid, change, used, int(ours), int(simulated)),
            )
        )

    def forget_readings(self, older_than: float) -> None:
        self._submit(
            lambda conn: conn.execute("DELETE FROM resource_log WHERE at < ?", (older_than,)),
            keep=False,
        )

    def evicted(
        self,
        model: str,
        artifact: str,
        devices: dict[str, int],
        reason: str,
        for_model: str | None = None,
        call_id: int | None = None,
        idle_seconds: float | None = None,
    ) -> None:
        now = time.time()
        self._submit(
            lambda conn: self._insert(
                conn,
                "eviction",
                "evictions",
                "INSERT INTO evictions (at, model, artifact, devices, reason, for_model, call_id, "
                "idle_seconds) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    now,
                    model,
                    artifact,
                    json.dumps(devices),
                    reason,
                    for_model,
                    call_id,
                    idle_seconds,
                ),
            )
        )

    def pulled(
        self,
        source: str,
        path: str | None,
        size: int | None,
        verified: bool,
        outcome: str,
        detail: str | None = None,
        seconds: float | None = None,
    ) -> None:
        now = time.time()
        self._submit(
            lambda conn: self._insert(
                conn,
                "pull",
                "pulls",
                "INSERT INTO pulls (at, source, path, bytes, verified, outcome, detail, seconds) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (now, source, path, size, int(verified), outcome, detail, seconds),
            )
        )

    def scouted(self, rows: list[tuple[Any, ...]]) -> None:
        """Scout's findings (path, name, bytes, source, evidence, led_by, servable, detail),
        an event each, so a central's mirror replays them (migrations/0016)."""
        now, sql = (
            time.time(),
            (
                "INSERT INTO scout_findings (at, path, name, bytes, source, evidence, led_by, "
                "servable, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
            ),
        )
        self._submit(
            lambda conn: [
                self._insert(conn, "scout", "scout_findings", sql, (now, *r)) for r in rows
            ]
        )

    def window_refused(
        self,
        artifact: Path,
        placement: str,
        window: int,
        type_k: str,
        type_v: str,
        detail: str | None,
        call_id: int | None,
    ) -> None:
        try:
            stat = artifact.stat()
        except OSError:
            return
        key = (str(artifact), stat.st_size, stat.st_mtime_ns, placement, window)
        now = time.time()
        self._submit(
            lambda conn: self._event(
                conn,
                "fact",
                "refused_windows",
                facts.insert_refused_window(conn, key, type_k, type_v, detail, call_id, now),
            )
        )

    def refused_windows(self) -> list[tuple[RefusedWindowKey, str | None]]:
        """(artifact, size, mtime_ns, placement, window) of every refused window, with the
        box that measured it (None: this one)."""
        try:
            result: list[tuple[RefusedWindowKey, str | None]] = self.run(facts.refused_windows)
        except sqlite3.Error:
            return []
        return result

    def speed_measured(self, speed: MeasuredSpeed) -> None:
        self._submit(
            lambda conn: self._event(
                conn, "fact", "measured_speeds", facts.insert_speed(conn, speed)
            )
        )

    def recent_speeds(self) -> list[MeasuredSpeed]:
        """The last 20 speeds of every (file, rung), oldest first (read once, at start)."""
        try:
            result: list[MeasuredSpeed] = self.run(facts.recent_speeds)
        except sqlite3.Error:
            return []
        return result

    def recent_curve(self) -> list[facts.CurvePoint]:
        """The thread curve's last points per (file, rung), oldest first (read at start)."""
        try:
            result: list[facts.CurvePoint] = self.run(facts.recent_curve)
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
        self._writer.hurry()

    async def committed(self, barrier: Future[Any], limit: float) -> None:
        """Await a ``barrier()`` for at most ``limit`` seconds, the writer hurried; a store
        that fails or cannot commit in time is not waited for (its failures are counted).
        Shielded: a cancelled wait (a client gone) must not cancel the writer's future,
        whose settling would then raise in the writer's thread."""
        if barrier.done():
            return
        self.hurry()
        with contextlib.suppress(Exception):  # sqlite3.Error, TimeoutError
            async with asyncio.timeout(limit):
                await asyncio.shield(asyncio.wrap_future(barrier))

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
        self._writer.stop()
        self._conn.close()
