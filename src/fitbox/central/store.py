"""The central's store: one SQLite file (owner-only, WAL; the default) or a PostgreSQL
database (``FITBOX_CENTRAL_DB=postgresql://…``), with one migration sequence for both
(migrations/central/, in the SQL both accept; backend.py is where they differ). One
connection behind a lock: the central's writes are few and short (a registration, a
mirrored page), and every mirrored page lands with its cursor in one transaction, which is
what "nothing lost, nothing twice" rests on."""

from __future__ import annotations

import hmac
import json
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fitbox.central import identity
from fitbox.central.backend import StoreTarget, open_backend
from fitbox.store.keys import KeyChecker
from fitbox.store.migrations import load_migrations, migrations_dir

# a value in a column named like this is a number (or null) on every box: text there is a
# row the mirror does not expect, kept raw with the reason
NUMERIC_NAMES = frozenset({"id", "seq", "pid", "port", "http_status", "window", "stream"})
NUMERIC_ENDINGS = ("_at", "_bytes", "_tokens", "_ms", "_percent", "_time", "_seconds")
KEY_RANGE = range(-(2**63), 2**63)  # id and cursor are stored as 64-bit integers on both


def central_migrations() -> Path:
    return migrations_dir() / "central"


@dataclass(frozen=True)
class BoxRecord:
    box_id: str
    name: str
    version: str
    url: str
    admin_key: str
    registered_at: float
    last_seen_at: float | None
    counter: int | None
    secret_hash: str | None = None  # of the box's proof of identity; never shown
    label: str | None = None  # a person's name for it (fitbox central boxes rename)
    draining: int = 0  # bare-name calls go elsewhere (fitbox central boxes drain)
    models: str | None = None  # its /v1/models list as last read (JSON): known before a sync

    @property
    def shown_name(self) -> str:
        return self.label or self.name

    def public(self) -> dict[str, Any]:
        """Without its key: the box's admin key never leaves the central."""
        return {
            "box_id": self.box_id,
            "name": self.shown_name,
            "host_name": self.name,
            "draining": bool(self.draining),
            "version": self.version,
            "url": self.url,
            "registered_at": self.registered_at,
            "last_seen_at": self.last_seen_at,
            "counter": self.counter,
        }


@dataclass(frozen=True)
class Registered:
    moved: bool  # new, or at another address
    secret: str | None  # minted now: the box's proof, told to it this once


def rejection(row: object, cursor: str) -> str | None:
    """Why the mirror cannot take ``row``, or None when it can."""
    if not isinstance(row, dict):
        return f"a row is a JSON object; this is {type(row).__name__}"
    for column in ("id", cursor):
        value = row.get(column)
        if not isinstance(value, int) or isinstance(value, bool):
            return f"column {column!r} must be an integer; it is {value!r}"
        if value not in KEY_RANGE:
            return f"column {column!r} must fit in 64 bits; it is {value!r}"
    for column, value in row.items():
        if isinstance(value, dict | list):
            return f"column {column!r} holds a {type(value).__name__}, not a single value"
        numeric = column in NUMERIC_NAMES or column.endswith(NUMERIC_ENDINGS)
        if (
            numeric
            and value is not None
            and (
                not isinstance(value, int | float)
                or isinstance(value, bool)
                or not math.isfinite(value)
            )
        ):
            return f"column {column!r} must be a number or null; it is {value!r}"
    return None


class CentralStore:
    """``target``: the SQLite file, or a postgresql:// URL. ``where``: the store named for
    people (a URL's password as ***)."""

    def __init__(self, target: StoreTarget) -> None:
        self._lock = threading.Lock()
        self._backend = open_backend(target)
        self.where = self._backend.describe()
        self.path = target if isinstance(target, Path) else self.where
        try:
            self._backend.migrate(load_migrations(central_migrations()))
        except BaseException:
            self._backend.close()
            raise

    @contextmanager
    def _transaction(self) -> Iterator[Any]:
        with self._lock, self._backend.transaction() as conn:
            yield conn

    @contextmanager
    def _reading(self) -> Iterator[Any]:
        with self._lock, self._backend.reading() as conn:
            yield conn

    def check(self) -> None:
        """Raises StoreUnavailable (naming the store) when it cannot be read now."""
        with self._lock:
            self._backend.check()

    def key_checker(self) -> KeyChecker:
        """A checker reading this store's keys fresh on every call (on its own connection)."""
        return self._backend.key_checker()

    def run(self, job: Any) -> Any:
        """``job(conn)`` in one transaction (the keys functions of store/keys.py)."""
        with self._transaction() as conn:
            return job(conn)

    # -- boxes ---------------------------------------------------------------------

    def register(
        self,
        box_id: str,
        name: str,
        version: str,
        url: str,
        admin_key: str,
        proof: str | None = None,
    ) -> Registered:
        """Add a box, or update one that proves it is that box (central/identity.py: raises
        BoxIdentityRefused, the row untouched, when it does not)."""
        with self._transaction() as conn:
            old = conn.execute(
                "SELECT url, secret_hash, admin_key FROM boxes WHERE box_id = ?", (box_id,)
            ).fetchone()
            needs_secret = old is None or identity.check(
                box_id, url, proof, old[1], old[0], hmac.compare_digest(old[2], admin_key)
            )
            secret, secret_hash = identity.mint() if needs_secret else (None, old[1])
            conn.execute(
                "INSERT INTO boxes (box_id, name, version, url, admin_key, registered_at, "
                "secret_hash) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (box_id) DO UPDATE SET "
                "name = excluded.name, version = excluded.version, url = excluded.url, "
                "admin_key = excluded.admin_key, secret_hash = excluded.secret_hash",
                (box_id, name, version, url, admin_key, time.time(), secret_hash),
            )
        return Registered(moved=old is None or old[0] != url, secret=secret)

    def boxes(self) -> list[BoxRecord]:
        with self._reading() as conn:
            rows = conn.execute("SELECT * FROM boxes ORDER BY registered_at").fetchall()
        return [BoxRecord(**dict(r)) for r in rows]

    def remove(self, box_id: str) -> bool:
        """Forget a box: its row (its key and proof) and its cursors. Its mirrored rows stay
        as history; a box that joins again under that id is replayed from the start, each
        row upserted over its earlier copy."""
        with self._transaction() as conn:
            gone = conn.execute("DELETE FROM boxes WHERE box_id = ?", (box_id,)).rowcount
            conn.execute("DELETE FROM mirror_cursors WHERE box_id = ?", (box_id,))
        return bool(gone)

    def set_box(self, box_id: str, column: str, value: object) -> bool:
        """Set a person's ``label`` (None clears it) or ``draining`` of a box; False when
        there is no such box."""
        assert column in ("label", "draining")
        with self._transaction() as conn:
            changed = conn.execute(
                f"UPDATE boxes SET {column} = ? WHERE box_id = ?",  # noqa: S608
                (value, box_id),
            ).rowcount
        return bool(changed)

    def keep_models(self, box_id: str, models: list[dict[str, Any]]) -> None:
        """The box's model list as the mirror read it: what a restart knows before a sync."""
        with self._transaction() as conn:
            conn.execute(
                "UPDATE boxes SET models = ? WHERE box_id = ?",
                (json.dumps(models, sort_keys=True), box_id),
            )

    def seen(self, box_id: str, counter: int) -> None:
        with self._transaction() as conn:
            conn.execute(
                "UPDATE boxes SET last_seen_at = ?, counter = ? WHERE box_id = ?",
                (time.time(), counter, box_id),
            )

    # -- the mirror ----------------------------------------------------------------

    def cursor(self, box_id: str, table: str) -> int:
        with self._reading() as conn:
            row = conn.execute(
                "SELECT cursor FROM mirror_cursors WHERE box_id = ? AND tbl = ?", (box_id, table)
            ).fetchone()
        return int(row[0]) if row else 0

    def take_page(
        self, box_id: str, table: str, cursor: str, rows: list[Any], next_cursor: int
    ) -> int:
        """Store one page of a table's replay and its cursor, together. Returns how many
        rows were rejected (kept raw)."""
        taken: list[tuple[Any, ...]] = []
        kept_raw: list[tuple[Any, ...]] = []
        now = time.time()
        for row in rows:
            reason = rejection(row, cursor)
            raw = json.dumps(row, sort_keys=True)
            if reason is None:
                taken.append((box_id, table, row["id"], row.get("seq"), raw))
                continue
            source = row.get("id") if isinstance(row, dict) else None
            kept_raw.append(
                (box_id, table, str(source) if source is not None else raw, raw, reason, now)
            )
        with self._transaction() as conn:
            # executemany: one statement, many rows (psycopg pipelines them: one round trip)
            conn.executemany(
                "INSERT INTO mirrored_rows (box_id, tbl, source_id, seq, data) VALUES "
                "(?, ?, ?, ?, ?) ON CONFLICT (box_id, tbl, source_id) DO UPDATE SET "
                "seq = excluded.seq, data = excluded.data",
                taken,
            )
            had_rejects = conn.execute(
                "SELECT 1 FROM mirror_rejects WHERE box_id = ? AND tbl = ? LIMIT 1", (box_id, table)
            ).fetchone()
            if had_rejects and taken:  # a row fixed on the box is mirrored, no longer raw
                fixed = [(b, t, str(i)) for b, t, i, _, _ in taken]
                conn.executemany(
                    "DELETE FROM mirror_rejects WHERE box_id = ? AND tbl = ? AND source_id = ?",
                    fixed,
                )
            if kept_raw:
                conn.executemany(
                    "INSERT INTO mirror_rejects (box_id, tbl, source_id, raw, reason, at) "
                    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (box_id, tbl, source_id) DO UPDATE "
                    "SET raw = excluded.raw, reason = excluded.reason, at = excluded.at",
                    kept_raw,
                )
            conn.execute(
                "INSERT INTO mirror_cursors (box_id, tbl, cursor) VALUES (?, ?, ?) ON CONFLICT "
                "(box_id, tbl) DO UPDATE SET cursor = excluded.cursor",
                (box_id, table, next_cursor),
            )
        return len(kept_raw)

    def mirrored(
        self, table: str, box_id: str | None, limit: int, offset: int, desc: bool
    ) -> list[dict[str, Any]]:
        """Mirrored rows of one table (of one box, or all), each with its ``box_id``."""
        where, params = "tbl = ?", [table]
        if box_id:
            where, params = where + " AND box_id = ?", [*params, box_id]
        order = "DESC" if desc else "ASC"
        with self._reading() as conn:
            found = conn.execute(
                f"SELECT box_id, data FROM mirrored_rows WHERE {where} "  # noqa: S608
                f"ORDER BY box_id {order}, source_id {order} LIMIT ? OFFSET ?",
                (*params, limit, offset),
            ).fetchall()
        return [{"box_id": r[0], **json.loads(r[1])} for r in found]

    def rejects(self, limit: int, offset: int) -> list[dict[str, Any]]:
        with self._reading() as conn:
            found = conn.execute(
                "SELECT box_id, tbl, source_id, raw, reason, at FROM mirror_rejects ORDER BY at "
                "LIMIT ? OFFSET ?",
                (limit, offset),
            ).fetchall()
        return [dict(r) for r in found]

    def table_columns(self) -> dict[str, list[str]]:
        """Each mirrored table with the columns its rows carry (box_id first), read from
        one box's newest row of it (the greatest box id: the same answer every time)."""
        with self._reading() as conn:
            newest = conn.execute(
                "SELECT tbl, box_id, MAX(source_id) FROM mirrored_rows GROUP "
                "BY tbl, box_id ORDER BY tbl, box_id"
            ).fetchall()
            chosen = {r[0]: (r[1], r[2]) for r in newest}  # the last box of each table wins
            found = {}
            for tbl, (box, source) in chosen.items():
                found[tbl] = conn.execute(
                    "SELECT data FROM mirrored_rows WHERE box_id = ? AND tbl = ? AND source_id = ?",
                    (box, tbl, source),
                ).fetchone()
        return {tbl: ["box_id", *json.loads(row[0])] for tbl, row in found.items() if row}

    def close(self) -> None:
        with self._lock:
            self._backend.close()
