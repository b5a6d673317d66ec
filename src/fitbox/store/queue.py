"""The store's queue: every write goes to the one writer thread (store/writer.py) as a job;
a row of a cursor table is stamped with an event, so the change counter moves and a
central's mirror replays it. The rooms of the store (db.py: the call log and the file
itself, history.py, fact_rows.py) all write through this."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from fitbox.store.writer import Job, Writer

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


class Queued:
    """What every part of the store writes through: the writer and its events."""

    _writer: Writer

    @property
    def write_failures(self) -> int:
        return self._writer.state.failures

    @property
    def counter(self) -> int:
        """The change counter: the newest committed event's id."""
        return self._writer.counter

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

    def on_new_file(self, job: Job) -> None:
        """Run ``job`` (in the writer's thread) on each store file made while the box runs."""
        self._writer.on_new_file.append(job)

    def _submit(
        self, job: Job, wait: bool = False, keep: bool = True, lazy: bool = False
    ) -> Future[Any] | None:
        return self._writer.submit(job, wait, keep, lazy)

    def _insert(
        self, conn: sqlite3.Connection, kind: str, table: str, sql: str, params: tuple[Any, ...]
    ) -> int:
        row_id = int(conn.execute(sql, params).lastrowid or 0)
        self._event(conn, kind, table, row_id)
        return row_id

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
