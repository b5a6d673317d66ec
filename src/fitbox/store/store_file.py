"""The store's file: opened and checked at start (a damaged one set aside), watched while it
runs, and replaced when it is no longer the file the writer's connection holds.

A file can go wrong under a running box in three ways, and none of them may cost the box
its keys or its future rows. Deleted (or replaced by another file): the writer's connection
still holds every row on the old inode, where nothing would ever be read again, so the
whole database is copied from that connection (SQLite's backup) into a new file at the
path. Damaged (pages overwritten, the header gone): the file is set aside as at start and a
new one made, with every row SQLite can still read from the damaged one copied in (keys,
settings and the box's id first). Either way the writes that were waiting go into the new
file (store/writer.py retries its batch), and :class:`Replaced` says what happened.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from fitbox.store.failures import (
    DAMAGE_CODES,
    StoreUnavailable,
    is_resource_failure,
    primary_code,
)
from fitbox.store.migrations import load_migrations, migrate
from fitbox.store.sqlite_file import connect

log = logging.getLogger("fitbox.store.db")
HEADER = b"SQLite format 3\x00"
# how often the writer looks at its file while nothing fails: with the first batch at least
# CHECK_S after its last look (the readings' commit, once per LAZY_S in store/writer.py), or
# on its own after LOOK_ALONE_S with no batch, so a box's writer wakes no more than before
CHECK_S = 2.5
LOOK_ALONE_S = 10.0
# copied first from a damaged file: what a box cannot rebuild by serving (who may call,
# how it is set, who it is); the rest of the history follows, as far as it can be read
KEPT_FIRST = ("api_keys", "box_identity", "settings")
_SKIPPED = frozenset({"schema_migrations", "sqlite_sequence"})


FileId = tuple[int, int]  # (device, inode)


def file_id(path: Path) -> FileId | None:
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino


def held(path: Path, opened: FileId | None) -> int | None:
    """A read-only descriptor of the store file ``opened`` names, kept for as long as the
    writer's connection to it, for :func:`trouble` to read its header through. The file is
    never opened and closed per look: closing any descriptor of a file drops every POSIX
    lock this process holds on it, SQLite's included, and another process's connection
    would then take itself for the last one and delete the -wal and -shm fitbox writes
    through (https://sqlite.org/howtocorrupt.html, 2.2). None when it is not that file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    found = os.fstat(fd)
    if (found.st_dev, found.st_ino) != opened:
        os.close(fd)  # another inode: no lock of ours is on it
        return None
    return fd


def let_go(fd: int | None) -> None:
    """Close a descriptor from :func:`held`, once no connection of this process holds the
    file it names (the writer's own is closed first)."""
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


def trouble(path: Path, opened: FileId | None, fd: int | None) -> tuple[str, bool] | None:
    """Why the file at ``path`` is no longer the store the writer holds open (and whether
    that is damage), or None; ``fd``: the file held open (:func:`held`), whose header is
    read. A file that cannot be looked at (a drive gone) is no reason: its writes fail and
    are kept (store/writer.py)."""
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return f"the store file {path} was deleted while fitbox ran", False
    except OSError:
        return None
    if (found.st_dev, found.st_ino) != opened:
        return f"the store file {path} was replaced by another file while fitbox ran", False
    if fd is None:
        return None
    try:
        head = os.pread(fd, len(HEADER), 0)
    except OSError:
        return None
    if head != HEADER:
        return f"the store file {path} was overwritten (its header is not SQLite's)", True
    return None


def is_damage(error: BaseException) -> bool:
    return primary_code(error) in DAMAGE_CODES


def interrupt_pending(conn: sqlite3.Connection, ended_at: float | None) -> int:
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
class Opened:
    conn: sqlite3.Connection
    id: FileId | None
    set_aside: Path | None = None  # where a damaged file was moved
    closed: int = 0  # call rows an earlier run left pending, closed as interrupted
    new: bool = False  # no store was there: a first start, or one deleted while stopped


def open_store(path: Path) -> Opened:
    """Open, check and migrate the store. Raises :class:`StoreUnavailable` when the drive,
    not the file, is the problem (full, failing, not ours): nothing is moved."""
    new = not path.exists()
    try:
        conn, aside = _open_checked(path)
        try:
            migrate(conn, load_migrations())
            closed = interrupt_pending(conn, None)
        except BaseException:
            conn.close()
            raise
    except (sqlite3.Error, OSError) as exc:
        if isinstance(exc, StoreUnavailable) or not is_resource_failure(exc):
            raise
        raise StoreUnavailable(path, "open", exc) from exc
    return Opened(conn, file_id(path), aside, closed, new)


def _open_checked(path: Path) -> tuple[sqlite3.Connection, Path | None]:
    """A file that fails its check when it *could* be read is damaged: it is moved aside
    and a new one started, so damage costs the history, never the service. An error
    reading it (full drive, I/O error, permission) is not damage and is raised."""
    try:
        conn = connect(path)
    except sqlite3.DatabaseError as exc:
        if not is_damage(exc):  # "file is not a database", malformed
            raise
        return _started_aside(path, str(exc))
    try:
        result = conn.execute("PRAGMA quick_check").fetchone()[0]
    except sqlite3.DatabaseError as exc:
        conn.close()
        if not is_damage(exc):
            raise
        return _started_aside(path, str(exc))
    if result == "ok":
        return conn, None
    conn.close()
    return _started_aside(path, str(result))


def _started_aside(path: Path, problem: str) -> tuple[sqlite3.Connection, Path]:
    aside = set_aside(path, "damaged")
    log.error(
        "store %s failed its check (%s); moved it to %s and started a new one",
        path,
        problem,
        aside,
    )
    return connect(path), aside


def set_aside(path: Path, why: str, parts: tuple[str, ...] = ("", "-wal", "-shm")) -> Path:
    """Move the store file and its -wal and -shm (what of them is there) out of the way."""
    aside = path.with_name(f"{path.name}.{why}-{time.strftime('%Y%m%dT%H%M%S')}")
    for suffix in parts:
        source = Path(f"{path}{suffix}")
        if source.exists():
            os.replace(source, Path(f"{aside}{suffix}"))
    return aside


@dataclass
class Replaced:
    """A store file made while the box ran, in place of one deleted, replaced or damaged."""

    conn: sqlite3.Connection
    id: FileId | None
    reason: str
    set_aside: Path | None
    kept: dict[str, int] = field(default_factory=dict)  # rows copied, by table
    lost: list[str] = field(default_factory=list)  # tables that could not be read whole

    def said(self) -> str:
        """What an operator reads in /health and the log."""
        aside = f"; the old file is at {self.set_aside}" if self.set_aside else ""
        if not self.lost:
            return f"{self.reason}: a new one was made with every row kept{aside}"
        return (
            f"{self.reason}: a new one was made{aside}; rows kept: "
            + ", ".join(f"{table} {count}" for table, count in self.kept.items() if count)
            + f"; could not be read whole, rows lost: {', '.join(self.lost)}"
        )


def replace(
    old: sqlite3.Connection, path: Path, reason: str, damaged: bool, counter: int
) -> Replaced:
    """A new store file at ``path`` holding what ``old`` still can give, ``old`` closed;
    its events go on from ``counter`` (a central's mirror and the metrics follow them).
    The -wal and -shm at the path belong to the old file, which ``old`` holds open: beside
    a damaged file they are set aside with it; beside a file deleted or replaced (by one
    that is not theirs) they are removed, or SQLite would read them into the next file
    there, and their rows are read through ``old``."""
    if damaged:
        aside = set_aside(path, "damaged")
    else:
        aside = set_aside(path, "replaced", ("",))
        for suffix in ("-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
    found = Replaced(old, None, reason, aside if aside.exists() else None)
    if not damaged:
        found.conn = connect(path)
        if _copied_whole(old, found.conn):
            return _done(old, path, found)
        found.conn.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
    found.conn = connect(path)
    try:
        migrate(found.conn, load_migrations())
        _salvage(old, found.conn, found)
        _continue_events(found.conn, counter)
    except BaseException:
        found.conn.close()
        raise
    return _done(old, path, found)


def _done(old: sqlite3.Connection, path: Path, found: Replaced) -> Replaced:
    found.id = file_id(path)
    with contextlib.suppress(sqlite3.Error):
        old.close()
    log.error("store: %s", found.said())
    return found


def _continue_events(conn: sqlite3.Connection, counter: int) -> None:
    """Event ids go on past ``counter``, never back: readers follow them as cursors."""
    row = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'events'").fetchone()
    if row is None:
        conn.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('events', ?)", (counter,))
    elif int(row[0]) < counter:
        conn.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = 'events'", (counter,))


def _copied_whole(old: sqlite3.Connection, new: sqlite3.Connection) -> bool:
    """Every page of ``old`` into ``new``; False when ``old`` cannot be read whole."""
    try:
        old.backup(new)
        result = new.execute("PRAGMA quick_check").fetchone()[0]
    except sqlite3.DatabaseError:
        return False
    return bool(result == "ok")


def _salvage(old: sqlite3.Connection, new: sqlite3.Connection, found: Replaced) -> None:
    """Copy every row ``old`` can still read into ``new``'s tables, as one transaction."""
    tables = [str(r[0]) for r in new.execute("SELECT name FROM sqlite_schema WHERE type='table'")]
    tables.sort(key=lambda t: (t not in KEPT_FIRST, t))
    new.execute("PRAGMA foreign_keys = OFF")  # rows come table by table, parents maybe later
    new.execute("BEGIN")
    for table in tables:
        if table not in _SKIPPED:
            found.kept[table] = _copy_table(old, new, table, found)
    new.execute("COMMIT")
    new.execute("PRAGMA foreign_keys = ON")


def _copy_table(
    old: sqlite3.Connection, new: sqlite3.Connection, table: str, found: Replaced
) -> int:
    copied = 0
    try:
        cursor = old.execute(f'SELECT * FROM "{table}"')  # noqa: S608 - the store's own names
        names = ", ".join(f'"{d[0]}"' for d in cursor.description)
        marks = ", ".join("?" * len(cursor.description))
        insert = f'INSERT OR IGNORE INTO "{table}" ({names}) VALUES ({marks})'  # noqa: S608
        while rows := cursor.fetchmany(500):
            new.executemany(insert, [tuple(row) for row in rows])
            copied += len(rows)
    except sqlite3.Error:
        found.lost.append(table)
    return copied
