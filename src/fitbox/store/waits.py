"""Store work an HTTP request waits on: never on the event loop, never past a bound.

A read (``read``) runs on a read-only connection of its own in one of ``READERS`` threads.
In WAL mode a reader never waits for a writer, so a write lock another process holds (an
operator's ``sqlite3`` inside a transaction, a backup tool) costs reads nothing, and the
writer's queue, which waits out SQLite's busy timeout on each batch while that lock is
held, is not in a read's way. A read sees everything committed before it began; the
writes a request made itself were awaited (``write``) and so are committed.

A write (``write``) goes to the store's one writer (store/writer.py), in order with what is
queued, inside a savepoint of its own. Both answer within ``STORE_WAIT_S`` or raise
:class:`StoreBusy` (503 with ``Retry-After``), and a change its caller was told was not made
never lands later: a write that has not run when its caller stops waiting (the bound, or a
client gone) is skipped, and one that was running then is rolled back to its savepoint.

``problems`` is what ``/health`` says of the store, looked at off the loop: the store's own
problems, a write lock something outside fitbox holds now (``lock_holder``, which never
waits for it), and a writer that has not run a no-op job within the bound (``writer_late``).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

from fitbox.errors import StoreBusy, StoreUnreadable
from fitbox.store.db import Store
from fitbox.store.failures import primary_code

T = TypeVar("T")

# A request waits this long for the store at most. A healthy store answers a request's
# read or write in milliseconds; the writer waits SQLite's busy timeout (5 s, sqlite_file.py)
# for a lock another process holds, so a request that would wait behind it answers first.
STORE_WAIT_S = 2.0
RETRY_AFTER_S = 5.0  # one busy timeout: by then the writer has tried the lock again
READERS = 4  # threads for requests' reads: a read stuck on a hung drive leaves the others
# how long /health looks for a write lock held by someone else: fitbox's own writer holds
# it for a commit (a millisecond or two), an outside holder for as long as it likes
LOCK_TRIES, LOCK_SPACING_S = 3, 0.01
# /health is polled by monitors with short timeouts of their own: a store it cannot look at
# within this long is reported as not answering, never waited for
HEALTH_WAIT_S = 0.5
BUSY_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})

_readers = ThreadPoolExecutor(max_workers=READERS, thread_name_prefix="fitbox-store-read")


def busy(path: Path, doing: str) -> StoreBusy:
    return StoreBusy(
        f"The store did not answer within {STORE_WAIT_S:g} s, so fitbox did not {doing}: "
        "another process holds its write lock (an operator's sqlite3 in a transaction, a "
        "backup) or its drive is slow. Nothing was changed; retry after Retry-After, and "
        "GET /health says what holds it.",
        retry_after=RETRY_AFTER_S,
        operator_reason=f"The store is {path}.",  # the box's own path: insiders only
    )


async def off_loop(work: Callable[[], T], bound: float | None = None) -> T:
    """``work()`` in a reader thread, awaited for at most ``bound`` s (``STORE_WAIT_S``;
    TimeoutError past it: a read not yet begun is then dropped, one running ends on its
    own)."""
    loop, limit = asyncio.get_running_loop(), STORE_WAIT_S if bound is None else bound
    async with asyncio.timeout(limit):  # not wait_for: it can swallow a cancel
        return await loop.run_in_executor(_readers, work)


async def bounded(work: Callable[[], T], path: Path, doing: str) -> T:
    """``work()`` (reads of the store ``path`` among its steps) off the loop within the
    bound, else :class:`StoreBusy` saying fitbox did not ``doing``."""
    try:
        return await off_loop(work)
    except TimeoutError:
        raise busy(path, doing) from None


def _connect(path: Path) -> sqlite3.Connection:
    """A read-only connection of the request's own: never the writer's, never a write.
    Text that is not UTF-8 (written by hand) reads with replacement characters."""
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=STORE_WAIT_S)
    conn.row_factory = sqlite3.Row
    conn.text_factory = lambda raw: raw.decode("utf-8", "replace")
    return conn


async def read(path: Path, job: Callable[[sqlite3.Connection], T], what: str = "read it") -> T:
    """``job(conn)`` on a read-only connection, off the loop, within ``STORE_WAIT_S``.
    ``what``: what the request wanted, for the error a person reads."""

    def run() -> T:
        with contextlib.closing(_connect(path)) as conn:
            return job(conn)

    try:
        return await off_loop(run)
    except TimeoutError:
        raise busy(path, what) from None
    except sqlite3.Error as exc:
        if primary_code(exc) in BUSY_CODES:
            raise busy(path, what) from None
        raise StoreUnreadable(
            f"fitbox could not {what}: its store {path} could not be read ({exc}). "
            "GET /health and the box's log say what is wrong with it.",
        ) from None


class _Step(Enum):
    QUEUED = "queued"
    RUNNING = "running"
    KEPT = "kept"  # ran, and its caller still waited: it lands with its batch's commit
    ABANDONED = "abandoned"  # its caller stopped waiting: it must not land


class Abandoned(Exception):
    """A waited write whose caller stopped waiting before it ran to the end."""


class _Waited:
    """A write that lands only while its caller still waits for it."""

    def __init__(self, job: Callable[[sqlite3.Connection], Any]) -> None:
        self.job, self.step, self._lock = job, _Step.QUEUED, threading.Lock()

    def __call__(self, conn: sqlite3.Connection) -> Any:
        with self._lock:
            if self.step is _Step.ABANDONED:
                raise Abandoned
            self.step = _Step.RUNNING
        conn.execute("SAVEPOINT waited")
        try:
            result = self.job(conn)
            with self._lock:
                if self.step is _Step.ABANDONED:
                    raise Abandoned
                self.step = _Step.KEPT
        except BaseException:
            with contextlib.suppress(sqlite3.Error):  # a transaction SQLite already ended
                conn.execute("ROLLBACK TO waited")
                conn.execute("RELEASE waited")
            raise
        conn.execute("RELEASE waited")
        return result

    def abandon(self) -> bool:
        """Stop it landing; False when too late (it ran whole: its commit follows)."""
        with self._lock:
            if self.step is _Step.KEPT:
                return False
            self.step = _Step.ABANDONED
            return True


async def write(store: Store, job: Callable[[sqlite3.Connection], T], what: str = "change it") -> T:
    """``job(conn)`` on the store's writer, in order with what is queued; its result once
    committed. Past ``STORE_WAIT_S`` (or a cancel) it is abandoned: it never lands, and the
    caller hears :class:`StoreBusy`. A store that refused it (a full drive) raises
    ``StoreUnavailable`` as ``Store.run`` does; a lock that outlasted SQLite's busy timeout
    inside the bound is ``StoreBusy`` too."""
    waited = _Waited(job)
    future = store._submit(waited, wait=True)
    assert future is not None
    landing = asyncio.wrap_future(future)
    landing.add_done_callback(_heard)  # an abandoned one's end is heard by no one else
    try:
        try:
            # shielded: cancelling the writer's own future would make its settling raise in
            # the writer's thread (queue.py: committed)
            async with asyncio.timeout(STORE_WAIT_S):
                result: T = await asyncio.shield(landing)
                return result
        except TimeoutError:
            if waited.abandon():
                raise busy(store.path, what) from None
        async with asyncio.timeout(STORE_WAIT_S):  # it ran whole: its commit is a moment off
            result = await asyncio.shield(landing)
            return result
    except TimeoutError:
        raise StoreBusy(
            f"The store took the change but has not committed it within "
            f"{2 * STORE_WAIT_S:g} s; whether it was kept is not known yet. Look before "
            "retrying (GET the same resource).",
            retry_after=RETRY_AFTER_S,
            operator_reason=f"The store is {store.path}.",
        ) from None
    except sqlite3.Error as exc:
        if primary_code(exc) in BUSY_CODES:
            raise busy(store.path, what) from None
        raise
    except asyncio.CancelledError:
        waited.abandon()  # the client is gone: it never hears of the change, so none is made
        raise


def _heard(landing: asyncio.Future[Any]) -> None:
    if not landing.cancelled():
        landing.exception()


def writing(store: Store) -> bool:
    """False while the store's writes are refused (a full drive, a lock held outside):
    a caller waiting for a commit then waits for nothing."""
    return store._writer.state.failing is None


def lock_holder(path: Path) -> bool:
    """True when a connection other than a quick commit holds the store's write lock now.
    Tries to take it without waiting (and gives it back at once), a few times a moment
    apart; never creates the file."""
    try:
        conn = sqlite3.connect(
            f"{path.as_uri()}?mode=rw", uri=True, timeout=0, isolation_level=None
        )
    except sqlite3.Error:
        return False  # not a lock: /health hears of a store it cannot open from the store
    with contextlib.closing(conn):
        for attempt in range(LOCK_TRIES):
            if attempt:
                time.sleep(LOCK_SPACING_S)
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                if primary_code(exc) in BUSY_CODES:
                    continue
                return False
            conn.execute("ROLLBACK")
            return False
    return True


@dataclass
class _Heartbeat:
    """A no-op job sent to the writer by ``/health``, and when: one out at a time."""

    landed: Future[Any]
    sent: float  # time.monotonic()


_heartbeats: weakref.WeakKeyDictionary[Store, _Heartbeat] = weakref.WeakKeyDictionary()


def writer_late(store: Store) -> float | None:
    """Seconds the writer has left ``/health``'s last no-op job waiting, once that is more
    than ``STORE_WAIT_S`` (stuck on a lock, a hung drive, a job that never ends); else
    None, and a new one is sent when none is out. Never waits."""
    now, beat = time.monotonic(), _heartbeats.get(store)
    if beat is not None and not beat.landed.done():
        late = now - beat.sent
        return late if late > STORE_WAIT_S else None
    landed = store._submit(lambda conn: None, wait=True)
    assert landed is not None
    _heartbeats[store] = _Heartbeat(landed, now)
    return None


async def problems(store: Store) -> list[str]:
    """``Store.problems()``, a writer that is late, and a write lock held outside fitbox,
    looked at off the loop (the drive's free space is a system call a hung drive can hold)."""
    late = writer_late(store)

    def look() -> list[str]:
        found = store.problems()
        if late is not None:
            found.append(
                f"the store {store.path} has not finished a write for {late:.0f} s: changes "
                "(keys, settings) answer 503 store_busy until it does. Another problem here, "
                "else its drive or the box's log, says why"
            )
        if lock_holder(store.path):
            found.append(
                f"the store {store.path} is locked by another connection (an operator's "
                "sqlite3 in a transaction, a backup): calls are served and their rows wait "
                "in memory, but keys and settings cannot change (503 store_busy). End that "
                "connection's transaction"
            )
        return found

    try:
        return await off_loop(look, HEALTH_WAIT_S)
    except TimeoutError:
        return [
            f"the store {store.path} did not answer within {HEALTH_WAIT_S:g} s: its drive "
            "is slow or hung, or every reader is stuck on it. Check the drive holding it"
        ]
