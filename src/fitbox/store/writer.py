"""The store's writer: one thread owns the connection and commits queued jobs in groups.

Callers never wait for a write: they queue it and go on. The thread wakes at most once per
``LINGER_S``, drains what has queued up and commits it as one transaction (group commit),
so a busy box pays one commit and one thread wake-up for many call-log updates instead of a
GIL hand-off per write; ``hurry()`` cuts the linger short for a caller that waits on a
``barrier()`` (a call's row, before its first byte leaves). Reads go through the same thread
and are awaited. A lazy write (a sensor reading, one a second) wakes no one: it rides with
the next commit, a read, or the lazy write that finds the oldest unwoken one ``LAZY_S`` old,
so an idle box commits readings once per ``LAZY_S`` instead of at each one (each commit
woke the thread and took the GIL from the loop while an engine computed beside it).

A full (or failing) drive costs no write made meanwhile: a queued write that fails for want
of room (``SQLITE_FULL``, an I/O error) is kept in memory, in order, and tried again with
whatever queued since at most every ``RETRY_S``, up to ``KEEP_AT_MOST`` writes (past that
the oldest are dropped and counted as lost). Sensor readings are not kept: the next one
replaces them. An awaited job is never kept: its caller hears :class:`StoreUnavailable`.
Every failed write is counted once; the log says when writing stopped, at most once per
``LOG_EVERY_S`` while it stays stopped, and when it resumed.

The thread never dies: the file is looked at on every failure and every ``CHECK_S`` (with a
batch, or alone after ``LOOK_ALONE_S``); one deleted, replaced or damaged is replaced
(store/store_file.py), the batch that failed tried again in the new one and ``on_new_file``
told (the store puts back the rows of the calls it knows); anything else that escapes a
batch is logged, its waiting callers told, and the thread goes on.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fitbox.store.failures import StoreUnavailable, drive_free, is_resource_failure, primary_code
from fitbox.store.store_file import (
    CHECK_S,
    LOOK_ALONE_S,
    FileId,
    held,
    is_damage,
    let_go,
    replace,
    trouble,
)
from fitbox.units import format_bytes

log = logging.getLogger("fitbox.store.db")  # the store's one voice, whichever module speaks
LINGER_S = 0.02  # how long the writer lets work pile up after a wake-up
RETRY_S = 1.0  # how often writes kept back by a full drive are tried again
KEEP_AT_MOST = 20_000  # writes kept in memory while the drive is full (a call is ~4)
LOG_EVERY_S = 60.0  # one line per this while writes keep failing
LAZY_S = 5.0  # at most this long a lazy write waits for a commit to ride with

Job = Callable[[sqlite3.Connection], Any]


@dataclass
class Queued:
    job: Job
    future: Future[Any] | None = None
    keep: bool = True  # kept and tried again when the drive refuses it (readings are not)
    counted: bool = False  # already counted as a failed write


_STOP = Queued(lambda conn: None)
Result = tuple[Queued, Any, BaseException | None]


@dataclass
class Throttle:
    """Lets a log line through at most once per ``every`` seconds; counts the rest."""

    every: float
    last: float | None = None
    held: int = 0  # lines held back since the last one let through

    def allow(self, now: float) -> bool:
        if self.last is None or now - self.last >= self.every:
            self.last = now
            return True
        self.held += 1
        return False


@dataclass
class WriteState:
    """What the writer has failed to do: read by :meth:`Store.health` from other threads."""

    failures: int = 0  # writes that could not be written when they were made (each once)
    lost: int = 0  # of those, given up: kept past KEEP_AT_MOST, or still kept at close
    failing: str | None = None  # the last failure while writes are not landing, else None
    failing_code: int | None = None
    failing_since: float | None = None  # time.time()
    waiting: int = 0  # writes kept in memory, to be tried again
    file_problem: str | None = None  # what became of the file while the box ran, if anything
    set_aside: Path | None = None  # where the file that went wrong was moved, if it was
    throttle: Throttle = field(default_factory=lambda: Throttle(LOG_EVERY_S))


class Writer:
    def __init__(
        self, conn: sqlite3.Connection, path: Path, counter: int, file: FileId | None = None
    ) -> None:
        self.conn, self.path, self.file = conn, path, file
        self.held = held(path, file)  # its header is read through this (store_file.held)
        self.counter = counter  # the change counter: the newest committed event id
        self.batch_counter = counter  # moved by Queued._event (store/queue.py) inside a batch
        self.state = WriteState()
        self.listeners: list[Callable[[int], None]] = []
        self.on_new_file: list[Job] = []  # run (in one transaction) on a file made meanwhile
        self._checked_at = time.monotonic()
        self._queue: collections.deque[Queued] = collections.deque()  # appends are atomic
        self._kept: collections.deque[Queued] = collections.deque()
        self._retry_at = 0.0
        self._bugs = Throttle(LOG_EVERY_S)
        self._wake = threading.Event()
        self._hurry = threading.Event()  # someone waits on a commit: skip the linger
        # when the oldest lazy write still unwoken was queued: set by submitters, cleared by
        # the thread before it drains (a lazy write queued meanwhile is drained or starts anew)
        self._lazy_since: float | None = None
        self._thread = threading.Thread(target=self._loop, name="fitbox-store", daemon=True)
        self._thread.start()

    def submit(
        self, job: Job, wait: bool = False, keep: bool = True, lazy: bool = False
    ) -> Future[Any] | None:
        """Queue a job. ``lazy``: no wake-up of its own until ``LAZY_S`` has passed."""
        future: Future[Any] | None = Future() if wait else None
        self._queue.append(Queued(job, future, keep))
        if lazy and future is None:
            now = time.monotonic()
            if self._lazy_since is None:
                self._lazy_since = now
            if now - self._lazy_since < LAZY_S:
                return None
        if not self._wake.is_set():
            self._wake.set()
        return future

    def hurry(self) -> None:
        """Commit what is queued without lingering."""
        self._hurry.set()
        self._wake.set()

    def closed(self) -> None:
        """The connection closed: the file is let go (see store_file.held)."""
        self.conn.close()
        let_go(self.held)
        self.held = None

    def stop(self, timeout: float = 30.0) -> None:
        self._queue.append(_STOP)
        self._wake.set()
        self._thread.join(timeout=timeout)

    # -- the thread ---------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            # kept writes retry; else wake for a look at the file (store_file.py) that no
            # batch took: a box committing readings never wakes for it alone
            look_in = self._checked_at + LOOK_ALONE_S - time.monotonic()
            self._wake.wait(timeout=RETRY_S if self._kept else max(look_in, 0.0))
            self._wake.clear()  # before draining: a later submit wakes us again
            self._hurry.wait(LINGER_S)
            self._hurry.clear()  # before draining: what is queued now goes in this batch
            self._lazy_since = None
            batch = []
            while self._queue:
                batch.append(self._queue.popleft())
            stop = any(item is _STOP for item in batch)
            batch = [item for item in batch if item is not _STOP]
            try:
                self._apply(batch, last=stop)
                self._watch()
            except Exception as exc:  # a writer that died would leave the box unrecorded
                self._broke(batch, exc)
            if stop:
                self._give_up()
                return

    def _apply(self, batch: list[Queued], last: bool = False) -> None:
        """Commit a batch behind the writes kept back, or, while the drive refused them a
        moment ago, keep the new writes behind them and run only the awaited jobs."""
        now = time.monotonic()
        if self._kept and (last or now >= self._retry_at):
            batch = [*self._kept, *batch]
            self._kept.clear()
        elif self._kept:
            for item in batch:
                if item.future is None:
                    self._keep(item)
            batch = [item for item in batch if item.future is not None]
        if not batch:
            return
        changes = self.conn.total_changes
        results = self._transaction(batch)
        wrote = self.conn.total_changes != changes
        failed = [error for _, _, error in results if isinstance(error, sqlite3.Error)]
        if failed and self._replaced_for(failed):
            results, wrote = self._again(results), True
            self._tell_new_file()
        refused = [error for _, _, error in results if error and is_resource_failure(error)]
        for item, _, error in results:
            if error is not None and is_resource_failure(error):
                self._keep(item)  # an awaited one is counted only: its caller hears it
            elif error is not None and isinstance(error, sqlite3.Error) and not item.counted:
                self._failed(error)
        self.state.waiting = len(self._kept)
        if refused:
            self._retry_at = now + RETRY_S
            self._refused(refused[-1])
        elif wrote and not self._kept:
            self._resumed()
        self._settle(results)  # first: a call waiting on its row goes before the watchers
        self._moved()

    def _transaction(self, batch: list[Queued]) -> list[Result]:
        """Run a batch in one transaction. A job that fails on its own is its caller's and
        the rest go on. A drive that refuses one rolls the whole transaction back (SQLITE_FULL
        may have already): the writes it took with it fail too, each whole, so a retry never
        meets half a job (cheaper than a savepoint per job), and a new transaction goes on."""
        results: list[Result] = []
        try:
            self.conn.execute("BEGIN")
            for item in batch:
                results.append(self._one(item))
                error = results[-1][2]
                if error is not None and (
                    is_resource_failure(error) or not self.conn.in_transaction
                ):
                    if self.conn.in_transaction:
                        self.conn.execute("ROLLBACK")
                    results = self._lost(results, error)
                    self.conn.execute("BEGIN")
            self.conn.execute("COMMIT")
        except sqlite3.Error as exc:  # the commit itself failed: nothing in it landed
            with contextlib.suppress(sqlite3.Error):  # a damaged file may refuse it too
                if self.conn.in_transaction:
                    self.conn.execute("ROLLBACK")
            untried: list[Result] = [(item, None, exc) for item in batch[len(results) :]]
            results = self._lost(results, exc) + untried
        return results

    def _one(self, item: Queued) -> Result:
        try:
            return item, item.job(self.conn), None
        except Exception as exc:  # a job's own error is its caller's, never the writer's
            return item, None, exc

    def _lost(self, results: list[Result], exc: BaseException) -> list[Result]:
        """Writes that had succeeded inside a transaction that was then rolled back."""
        try:
            self.batch_counter = int(
                self.conn.execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()[0]
            )
        except sqlite3.Error:  # a damaged file: what it committed is as unknown as lost
            self.batch_counter = self.counter
        return [(item, None, error or exc) for item, _, error in results]

    # -- the file --------------------------------------------------------------------------

    def _watch(self) -> None:
        """Look at the file every ``CHECK_S``: a deleted or replaced one fails no write (they
        land on the old inode, never to be read), so only looking finds it."""
        now = time.monotonic()
        if now - self._checked_at < CHECK_S:
            return
        self._checked_at = now
        found = trouble(self.path, self.file, self.held)
        if found is not None and self._replace(*found):
            self._tell_new_file()

    def _replaced_for(self, errors: list[sqlite3.Error]) -> bool:
        """After failed writes: True when the file was the cause and has been replaced."""
        self._checked_at = time.monotonic()
        found = trouble(self.path, self.file, self.held)
        damage = next((error for error in errors if is_damage(error)), None)
        if damage is not None:
            reason = found[0] if found else f"the store file {self.path} is damaged ({damage})"
            return self._replace(reason, True)
        return found is not None and self._replace(*found)

    def _replace(self, reason: str, damaged: bool) -> bool:
        with contextlib.suppress(sqlite3.Error):
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
        try:
            made = replace(self.conn, self.path, reason, damaged, self.counter)
        except (sqlite3.Error, OSError) as exc:  # tried again at the next failure or look
            self.state.file_problem = f"{reason}; a new file could not be made yet ({exc})"
            if self._bugs.allow(time.monotonic()):
                log.error("store: %s", self.state.file_problem)
            return False
        let_go(self.held)  # the old file's: replace() closed the connection to it
        self.conn, self.file = made.conn, made.id
        self.held = held(self.path, self.file)
        self.state.file_problem, self.state.set_aside = made.said(), made.set_aside
        return True

    def _again(self, results: list[Result]) -> list[Result]:
        """The jobs of a batch that failed in the old file, run in the new one (those that
        succeeded there were copied with it, as far as it could be read)."""
        failed = [item for item, _, error in results if error is not None]
        redone = {id(result[0]): result for result in self._transaction(failed)}
        return [redone.get(id(result[0]), result) for result in results]

    def _tell_new_file(self) -> None:
        for job in self.on_new_file:
            try:
                self.conn.execute("BEGIN")
                job(self.conn)
                self.conn.execute("COMMIT")
            except Exception as exc:
                with contextlib.suppress(sqlite3.Error):
                    if self.conn.in_transaction:
                        self.conn.execute("ROLLBACK")
                log.error("store: a new file could not be filled in (%s)", exc)
        self._moved()

    def _moved(self) -> None:
        if self.batch_counter != self.counter:
            self.counter = self.batch_counter
            for listener in self.listeners:
                try:
                    listener(self.counter)
                except Exception as exc:  # a closed event loop: the writer is not its to stop
                    if self._bugs.allow(time.monotonic()):
                        log.error("store: a change listener failed (%r)", exc)

    def _broke(self, batch: list[Queued], exc: Exception) -> None:
        """Something no batch should raise: every caller still waiting hears it, the file is
        looked at, and the writer goes on."""
        self.state.failures += len(batch)
        if self._bugs.allow(time.monotonic()):
            log.exception("store writer: a batch of %d jobs failed (%s)", len(batch), exc)
        with contextlib.suppress(sqlite3.Error):
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
        for item in batch:
            if item.future is not None and not item.future.done():
                item.future.set_exception(exc)
        with contextlib.suppress(Exception):
            self._checked_at = 0.0
            self._watch()

    def _keep(self, item: Queued) -> None:
        if not item.counted:
            item.counted = True
            self.state.failures += 1
        if not item.keep or item.future is not None:
            return  # a sensor reading (the next one replaces it), or a caller told of it
        self._kept.append(item)
        if len(self._kept) > KEEP_AT_MOST:
            self._kept.popleft()
            self.state.lost += 1

    def _settle(self, results: list[Result]) -> None:
        for item, value, error in results:
            if item.future is None or item.future.done():  # done: cancelled by its caller
                continue
            if error is None:
                item.future.set_result(value)
            elif is_resource_failure(error) and not isinstance(error, StoreUnavailable):
                item.future.set_exception(StoreUnavailable(self.path, "write to", error))
            else:
                item.future.set_exception(error)

    # -- what the log says ----------------------------------------------------------------

    def _refused(self, error: BaseException) -> None:
        state, now = self.state, time.monotonic()
        first = state.failing is None
        state.failing, state.failing_code = str(error), primary_code(error)
        if first:
            state.failing_since = time.time()
            state.throttle = Throttle(LOG_EVERY_S)
        if not state.throttle.allow(now):
            return
        free = drive_free(self.path)
        room = f"{format_bytes(free)} free on its drive" if free is not None else "no drive"
        if first:
            log.error(
                "store %s cannot write (%s; %s): writes are kept in memory and tried "
                "again every %.0f s, up to %d",
                self.path,
                error,
                room,
                RETRY_S,
                KEEP_AT_MOST,
            )
        else:
            log.error(
                "store %s still cannot write (%s; %s): %d writes failed so far, %d "
                "waiting, %d lost",
                self.path,
                error,
                room,
                state.failures,
                state.waiting,
                state.lost,
            )

    def _failed(self, error: sqlite3.Error) -> None:
        """A write the store itself refused (a constraint, a missing table): a bug to see."""
        self.state.failures += 1
        if self._bugs.allow(time.monotonic()):
            log.error("store write failed (%d so far): %s", self.state.failures, error)

    def _resumed(self) -> None:
        state = self.state
        if state.failing is None:
            return
        since = time.time() - (state.failing_since or time.time())
        log.warning(
            "store %s writes again after %.0f s: %d writes had failed, %d of them lost",
            self.path,
            since,
            state.failures,
            state.lost,
        )
        state.failing = state.failing_code = state.failing_since = None

    def _give_up(self) -> None:
        if self._kept:
            self.state.lost += len(self._kept)
            log.error(
                "store %s: %d writes could not be written before the stop and are lost (%s)",
                self.path,
                len(self._kept),
                self.state.failing,
            )
            self._kept.clear()
            self.state.waiting = 0
