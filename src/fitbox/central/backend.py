"""The central's two stores behind one seam: a SQLite file (the default: no server to run)
or a PostgreSQL database (``FITBOX_CENTRAL_DB=postgresql://…``, through psycopg 3) for a
fleet that outgrows one file.

store.py and the central's migrations are written once, in the SQL both accept, with
SQLite's ``?`` placeholders; this module is the one place the dialects differ:

- placeholders: ``?`` becomes ``%s`` for psycopg (``%`` is doubled);
- column types in DDL: SQLite's ``INTEGER`` (64 bits there) is ``BIGINT``, ``REAL``
  (a double there) is ``DOUBLE PRECISION`` and ``BLOB`` is ``BYTEA``;
- a write transaction: ``BEGIN IMMEDIATE`` (take SQLite's write lock first) or ``BEGIN``.

Both hand out rows that read by position and by name (``row[0]``, ``row["url"]``,
``dict(row)``), and both run the same migrate() bookkeeping (``schema_migrations``). The
URL's password is never printed: every message names the store by ``describe()``."""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from fitbox.errors import FitboxError
from fitbox.store.keys import KeyChecker
from fitbox.store.migrations import Migration, migrate
from fitbox.store.sqlite_file import connect

if TYPE_CHECKING:
    import psycopg

StoreTarget = Path | str  # a SQLite file, or a postgresql:// URL
POSTGRES_SCHEMES = ("postgresql://", "postgres://")
_TYPES = {"INTEGER": "BIGINT", "REAL": "DOUBLE PRECISION", "BLOB": "BYTEA"}
_TYPE_WORDS = re.compile(r"\b(INTEGER|REAL|BLOB)\b")
_DDL = re.compile(r"^\s*(?:--[^\n]*\n\s*)*(CREATE|ALTER)\s", re.IGNORECASE)
_PLACEHOLDER = re.compile(r"'(?:[^']|'')*'|\?|%")  # a quoted literal is left as it is
KEYS_REFUSED_S = 5.0  # after a failed connect, keys fail closed this long without trying
SQLITE_BUSY_S = 2.0  # a key read waits this long on a file another connection locked
_MIGRATION_LOCK = 0x66697462  # "fitb": one central migrates a database at a time


class StoreUnavailable(FitboxError):
    """The central's store cannot be opened or used now (a database down, a full disk);
    the message names it (no password). A request meeting it is answered 503."""

    status = 503
    type = "server_error"
    code = "store_unavailable"
    retry = True


def is_postgres(target: StoreTarget) -> bool:
    return isinstance(target, str) and target.startswith(POSTGRES_SCHEMES)


def redact(url: str) -> str:
    """``url`` with its password (if any) as ``***``: what logs and errors may show."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _scrub(text: str, url: str) -> str:
    """A driver's message with the URL's password taken out, wherever it was echoed."""
    password = urlsplit(url).password
    return text.replace(password, "***") if password else text


def to_postgres(sql: str, placeholders: bool = True) -> str:
    """One statement written for SQLite, as PostgreSQL reads it. ``placeholders``: the
    statement comes with parameters (psycopg reads a statement without any as it is)."""
    if _DDL.match(sql):
        sql = _TYPE_WORDS.sub(lambda m: _TYPES[m.group(1)], sql)
    if not placeholders:
        return sql

    def swap(match: re.Match[str]) -> str:
        token = match.group(0)
        return {"?": "%s", "%": "%%"}.get(token, token)

    return _PLACEHOLDER.sub(swap, sql)


class Row:
    """A PostgreSQL row read as sqlite3.Row reads: by position, by name, and by dict()."""

    __slots__ = ("_names", "_values")

    def __init__(self, names: dict[str, int], values: Sequence[Any]) -> None:
        self._names, self._values = names, values

    def __getitem__(self, key: int | str) -> Any:
        return self._values[self._names[key] if isinstance(key, str) else key]

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._values)

    def keys(self) -> list[str]:
        return list(self._names)


def _row_factory(cursor: Any) -> Any:
    names = {column.name: i for i, column in enumerate(cursor.description or ())}
    return lambda values: Row(names, values)


class PostgresConnection:
    """A psycopg connection (autocommit: transactions are the explicit BEGIN..COMMIT the
    store and migrate() write) that takes SQLite's SQL. ``with conn:`` commits or rolls
    back what the block began, as sqlite3's does. Functions written for a sqlite3
    connection (store/keys.py) may set ``row_factory``: rows read by name here anyway."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.raw = conn
        self.row_factory: Any = None

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> Any:
        if not parameters:
            return self.raw.execute(to_postgres(sql, placeholders=False))
        return self.raw.execute(to_postgres(sql), tuple(parameters))

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]], /) -> None:
        with self.raw.cursor() as cursor:
            cursor.executemany(to_postgres(sql), rows)

    def __enter__(self) -> PostgresConnection:
        return self

    def __exit__(self, kind: object, value: object, traceback: object, /) -> None:
        self.raw.execute("ROLLBACK" if kind is not None else "COMMIT")


class SqliteBackend:
    """One owner-only WAL file, one connection behind the store's lock. The file is the one
    opened at start for as long as the central runs: one deleted or put in its place meanwhile
    (the rows written since would go to a file no one can open again), or one that cannot be
    read (damaged, locked, unreadable), is StoreUnavailable, naming it: 503 on keyed calls,
    ``store: down`` on /health."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.conn = connect(path)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"cannot open the central's store {path}: {exc}") from None
        self.opened = _identity(path)

    def describe(self) -> str:
        return str(self.path)

    def migrate(self, migrations: list[Migration]) -> list[int]:
        return migrate(self.conn, migrations)

    def _unavailable(self, exc: BaseException) -> StoreUnavailable:
        return StoreUnavailable(f"the central's store {self.path}: {exc}")

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Any]:
        still_there(self.path, self.opened)
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.DatabaseError as exc:  # locked past busy_timeout, disk gone, damaged
            raise self._unavailable(exc) from None
        try:
            yield self.conn
        except sqlite3.DatabaseError as exc:  # a disk I/O error mid-transaction
            self.conn.execute("ROLLBACK")
            raise self._unavailable(exc) from None
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        try:
            self.conn.execute("COMMIT")
        except sqlite3.DatabaseError as exc:  # a full disk refuses the commit
            self.conn.execute("ROLLBACK")
            raise self._unavailable(exc) from None

    @contextlib.contextmanager
    def reading(self) -> Iterator[Any]:
        still_there(self.path, self.opened)
        try:
            yield self.conn  # WAL: a read needs no transaction and takes no lock
        except sqlite3.DatabaseError as exc:
            raise self._unavailable(exc) from None

    def check(self) -> None:
        """Read the file as a new reader would (the store's own connection answers from
        pages it holds, a damaged header unseen): StoreUnavailable when it cannot."""
        still_there(self.path, self.opened)
        _read_key(self.path, "")

    def key_checker(self) -> KeyChecker:
        return SqliteKeyChecker(self.path, self.opened)

    def close(self) -> None:
        self.conn.close()


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino


def still_there(path: Path, opened: tuple[int, int] | None) -> None:
    """StoreUnavailable unless ``path`` is still the file the central opened."""
    now = _identity(path)
    if now is None:
        raise StoreUnavailable(
            f"the central's store {path} is gone (deleted or moved while the central ran): "
            "put it back, or restart the central to start a new one"
        )
    if opened is not None and now != opened:
        raise StoreUnavailable(
            f"the central's store {path} is another file than the one the central opened "
            "(replaced while it ran): restart the central to use it"
        )


def _read_key(path: Path, key_id: str) -> Any:
    """The ``api_keys`` row of ``key_id`` (or None), read on a connection of its own, opened
    for this read; StoreUnavailable when the file cannot be read."""
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=rw", uri=True)
        try:
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_S * 1000)}")
            return conn.execute("SELECT * FROM api_keys WHERE key_id = ?", (key_id,)).fetchone()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise StoreUnavailable(f"the central's store {path} could not be read: {exc}") from None


class SqliteKeyChecker(KeyChecker):
    """KeyChecker's constant-time verify over the central's SQLite file, each key read on a
    connection opened for it (0.2 ms: a kept one answers from pages it holds, and would go
    on admitting keys from a damaged file). A file that cannot be read is StoreUnavailable
    (503, naming it), never an unknown key (401): the key was not found wrong, it was not
    read. No box key file stands in for it, as it does on a box."""

    def __init__(self, path: Path, opened: tuple[int, int] | None) -> None:
        super().__init__(path)
        self._opened_file = opened

    def _lookup(self, key_id: str) -> Any:
        still_there(self.path, self._opened_file)
        return _read_key(self.path, key_id)


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError:
        raise StoreUnavailable(
            "FITBOX_CENTRAL_DB names a PostgreSQL database, and psycopg 3 is not installed: "
            "pip install 'fitbox[central-pg]' (or psycopg[binary])"
        ) from None
    return psycopg


def _open_postgres(url: str) -> psycopg.Connection[Any]:
    psycopg = _psycopg()
    try:
        conn = psycopg.connect(
            url,
            autocommit=True,
            connect_timeout=10,
            row_factory=_row_factory,
            application_name="fitbox-central",
        )
    except (psycopg.Error, ValueError) as exc:  # ValueError: psycopg's own URL checks
        raise StoreUnavailable(
            f"cannot reach the central's store {redact(url)}: {_scrub(str(exc), url).strip()}"
        ) from None
    return conn  # type: ignore[no-any-return]


class PostgresBackend:
    """One connection behind the store's lock, opened again when it broke (a database
    restart): the next transaction after a cut works without restarting the central."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.conn = PostgresConnection(_open_postgres(url))

    def describe(self) -> str:
        return redact(self.url)

    def _live(self) -> PostgresConnection:
        if self.conn.raw.broken or self.conn.raw.closed:
            self.conn = PostgresConnection(_open_postgres(self.url))
        return self.conn

    def migrate(self, migrations: list[Migration]) -> list[int]:
        conn = self._live()
        conn.execute("SELECT pg_advisory_lock(?)", (_MIGRATION_LOCK,))
        try:
            return migrate(conn, migrations)
        finally:
            conn.execute("SELECT pg_advisory_unlock(?)", (_MIGRATION_LOCK,))

    def _begin(self) -> PostgresConnection:
        """BEGIN on a live connection: one the database dropped since the last call (a
        restart, a cut) is noticed here, before any work, and opened again."""
        psycopg = _psycopg()
        conn = self._live()
        try:
            conn.execute("BEGIN")
        except psycopg.OperationalError:
            if not conn.raw.broken:
                raise
            conn = self._live()
            conn.execute("BEGIN")
        return conn

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Any]:
        psycopg = _psycopg()
        try:
            conn = self._begin()
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(
                f"the central's store {self.describe()}: {_scrub(str(exc), self.url).strip()}"
            ) from None
        try:
            yield conn
            conn.execute("COMMIT")
        except psycopg.OperationalError as exc:  # the connection dropped mid-transaction
            self._roll_back(conn)
            raise StoreUnavailable(
                f"the central's store {self.describe()}: {_scrub(str(exc), self.url).strip()}"
            ) from None
        except BaseException:
            self._roll_back(conn)
            raise

    def _roll_back(self, conn: PostgresConnection) -> None:
        if not conn.raw.broken:
            with contextlib.suppress(_psycopg().Error):
                conn.execute("ROLLBACK")

    def reading(self) -> contextlib.AbstractContextManager[Any]:
        return self.transaction()  # one snapshot, and a dropped connection is opened again

    def check(self) -> None:
        with self.reading() as conn:
            conn.execute("SELECT 1").fetchone()

    def key_checker(self) -> KeyChecker:
        return PostgresKeyChecker(self.url)

    def close(self) -> None:
        self.conn.raw.close()


class PostgresKeyChecker(KeyChecker):
    """KeyChecker's constant-time verify over the central's PostgreSQL database: its own
    connection, read fresh on every call (a key revoked elsewhere counts at once)."""

    def __init__(self, url: str) -> None:  # not super's: no SQLite file to open
        self._url = url
        self._lock = threading.Lock()
        self._pg = PostgresConnection(_open_postgres(url))
        self._refused_until = 0.0
        self._refused_why = ""

    def _lookup(self, key_id: str) -> Any:
        """A dropped connection (a database restart) is opened again and the read tried
        once more. While the database cannot be reached, a presented key is neither
        admitted nor called invalid: StoreUnavailable (503, naming the store), at once for a
        few seconds rather than each request waiting out a connect (verify runs in a thread
        of its own, central/app.py CentralAuth: each waiting request holds one)."""
        psycopg = _psycopg()
        with self._lock:
            for attempt in (1, 2):
                try:
                    if self._pg.raw.broken or self._pg.raw.closed:
                        if time.monotonic() < self._refused_until:
                            raise StoreUnavailable(self._refused_why)
                        self._pg = PostgresConnection(_open_postgres(self._url))
                    return self._pg.execute(
                        "SELECT * FROM api_keys WHERE key_id = ?", (key_id,)
                    ).fetchone()
                except StoreUnavailable as exc:
                    if time.monotonic() >= self._refused_until:
                        self._refused_until = time.monotonic() + KEYS_REFUSED_S
                        self._refused_why = str(exc)
                    raise
                except psycopg.Error as exc:
                    if attempt == 2 or not self._pg.raw.broken:
                        raise StoreUnavailable(
                            f"the central's store {redact(self._url)} could not check the "
                            f"key: {_scrub(str(exc), self._url).strip()}"
                        ) from None
            return None

    def close(self) -> None:
        self._pg.raw.close()


def open_backend(target: StoreTarget) -> SqliteBackend | PostgresBackend:
    if is_postgres(target):
        return PostgresBackend(str(target))
    return SqliteBackend(Path(target))
