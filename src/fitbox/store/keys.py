"""API keys in the store: created with a secret shown once, kept as salted hashes, checked in
constant time. Reads use their own connection so that a revocation written by another
process (``fitbox keys revoke`` with the service running) counts on the very next request.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import re
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCOPES = ("admin", "inference", "read")
_KEY = re.compile(r"^fb_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")


class KeyError_(ValueError):
    """A key operation that cannot be done (bad scope, unknown id)."""


class BoxKeyHeld(KeyError_):
    """The live box key cannot be revoked alone: the box (its key file, its central) holds
    it as its root. Rotating it mints the new one first, then retires it."""


ROTATE_HINT = (
    "rotate it instead: 'fitbox keys rotate-box' mints a new box key, writes the key file "
    "and retires this one"
)


@dataclass(frozen=True)
class ApiKey:
    key_id: str
    name: str
    scopes: tuple[str, ...]
    models: tuple[str, ...] | None
    created_at: float
    expires_at: float | None
    revoked_at: float | None
    is_box_key: bool

    def active(self, now: float) -> bool:
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)

    def public(self) -> dict[str, object]:
        return {
            "id": self.key_id,
            "name": self.name,
            "scopes": list(self.scopes),
            "models": list(self.models) if self.models is not None else None,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "revoked_at": self.revoked_at,
            "box_key": self.is_box_key,
        }


def _digest(salt: bytes, secret: str) -> bytes:
    return hashlib.sha256(salt + secret.encode()).digest()


LONG_AGO = 0.0  # stands for a time a damaged row lost: the key is expired or revoked


def _time(value: object) -> float | None:
    """A stored time as a finite number, None for none; a time that is not a finite number
    (a row written before bodies refused Infinity, or by hand) reads as ``LONG_AGO``."""
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return LONG_AGO


def _names(text: object) -> tuple[str, ...]:
    """A stored JSON list of names; a damaged one is no names (no scope, no model)."""
    try:
        names = json.loads(text) if isinstance(text, str | bytes) else None
    except ValueError:
        return ()
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return ()
    return tuple(names)


def _row(row: sqlite3.Row) -> ApiKey:
    """A key as stored. A damaged row still reads (a listing never breaks on one) and fails
    closed: it grants nothing it did not grant before. An expiry of +Infinity is no expiry,
    what it meant; any other time that is not a finite number is long past."""
    expires = row["expires_at"]
    never = isinstance(expires, float) and expires == math.inf
    return ApiKey(
        key_id=str(row["key_id"]),
        name=str(row["name"]),
        scopes=_names(row["scopes"]),
        models=_names(row["models"]) if row["models"] else None,
        created_at=_time(row["created_at"]) or LONG_AGO,
        expires_at=None if never else _time(expires),
        revoked_at=_time(row["revoked_at"]),
        is_box_key=bool(row["is_box_key"]),
    )


def create_key(
    conn: sqlite3.Connection,
    name: str,
    scopes: tuple[str, ...],
    models: tuple[str, ...] | None = None,
    expires_at: float | None = None,
    is_box_key: bool = False,
    known: tuple[str, ...] = SCOPES,
) -> tuple[ApiKey, str]:
    """Store a new key; returns it and the full ``fb_<id>_<secret>`` (shown once).
    ``known``: the scopes this store's keys may have (a central's add worker)."""
    unknown = [s for s in scopes if s not in known]
    if not scopes or unknown:
        raise KeyError_(f"scopes must be some of {', '.join(known)}; got {list(scopes)}")
    key_id, secret, salt = secrets.token_hex(6), secrets.token_urlsafe(32), secrets.token_bytes(16)
    now = time.time()
    conn.execute(
        "INSERT INTO api_keys (key_id, name, scopes, models, salt, digest, created_at, "
        "expires_at, is_box_key) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            key_id,
            name,
            json.dumps(list(scopes)),
            json.dumps(list(models)) if models is not None else None,
            salt,
            _digest(salt, secret),
            now,
            expires_at,
            int(is_box_key),
        ),
    )
    key = ApiKey(key_id, name, scopes, models, now, expires_at, None, is_box_key)
    return key, f"fb_{key_id}_{secret}"


def adopt_key(
    conn: sqlite3.Connection, presented: str, name: str, scopes: tuple[str, ...]
) -> ApiKey | None:
    """Store ``presented`` (a full key kept outside the store: the box key's file) under its
    own id, for a store that has no record of it; None when it is not a key's form or the
    store knows its id (revoked or not: a known key is never replaced)."""
    match = _KEY.match(presented)
    if not match or find_key(conn, match.group(1)) is not None:
        return None
    key_id, salt, now = match.group(1), secrets.token_bytes(16), time.time()
    conn.execute(
        "INSERT INTO api_keys (key_id, name, scopes, salt, digest, created_at, is_box_key) "
        "VALUES (?, ?, ?, ?, ?, ?, 1)",
        (key_id, name, json.dumps(list(scopes)), salt, _digest(salt, match.group(2)), now),
    )
    return ApiKey(key_id, name, scopes, None, now, None, None, True)


def revoke_key(conn: sqlite3.Connection, key_id: str) -> ApiKey:
    """Revoke ``key_id``; refused (BoxKeyHeld) for the live box key."""
    held = find_key(conn, key_id)
    if held is not None and held.is_box_key and held.revoked_at is None:
        raise BoxKeyHeld(
            f"key {key_id!r} is the box key, the box's own admin key (its key file, the "
            f"central it registers with): revoking it would lock the box out; {ROTATE_HINT}"
        )
    cur = conn.execute(
        "UPDATE api_keys SET revoked_at = ? WHERE key_id = ? AND revoked_at IS NULL",
        (time.time(), key_id),
    )
    found = find_key(conn, key_id)
    if found is None:
        raise KeyError_(f"no key with id {key_id!r}")
    if not cur.rowcount and found.revoked_at is None:
        raise KeyError_(f"key {key_id!r} could not be revoked")
    return found


def rotate_box_key(conn: sqlite3.Connection) -> tuple[ApiKey, str, list[str]]:
    """A new box key, and every live box key before it revoked, in the caller's
    transaction: the new key, its secret, the ids retired."""
    conn.row_factory = sqlite3.Row
    retired = [
        str(r["key_id"])
        for r in conn.execute(
            "SELECT key_id FROM api_keys WHERE is_box_key = 1 AND revoked_at IS NULL"
        )
    ]
    key, secret = create_key(conn, "box key", ("admin",), is_box_key=True)
    conn.executemany(
        "UPDATE api_keys SET revoked_at = ? WHERE key_id = ?",
        [(time.time(), key_id) for key_id in retired],
    )
    return key, secret, retired


def find_key(conn: sqlite3.Connection, key_id: str) -> ApiKey | None:
    conn.row_factory = sqlite3.Row
    row = conn.execute("SELECT * FROM api_keys WHERE key_id = ?", (key_id,)).fetchone()
    return _row(row) if row else None


def list_keys(conn: sqlite3.Connection) -> list[ApiKey]:
    conn.row_factory = sqlite3.Row
    return [_row(r) for r in conn.execute("SELECT * FROM api_keys ORDER BY created_at")]


_UNREADABLE = object()  # what KeyChecker._lookup finds in a store it cannot read


class KeyChecker:
    """Verifies presented keys against the store, read fresh on every call. The file is
    opened again when another is at its path (the store replaced one deleted or damaged
    while the box ran, store/store_file.py), and never made here: while the path has no
    file, the one open still answers (a deleted file's rows are all there). While the store
    cannot be read at all (damaged, before the writer replaces it), the box key's file still
    opens: it is the root of trust, kept outside the store (store/box_key.py)."""

    def __init__(self, path: Path, box_key_file: Path | None = None) -> None:
        self._path, self._box_key_file = path, box_key_file
        self._revoked: set[str] = set()  # box keys seen revoked: the file never opens them
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._opened: tuple[int, int] | None = None

    @property
    def path(self) -> Path:
        return self._path

    def _connection(self) -> sqlite3.Connection | None:
        try:
            found = os.stat(self._path)
        except OSError:
            return self._conn
        with self._lock:
            if self._conn is None or self._opened != (found.st_dev, found.st_ino):
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
                conn = sqlite3.connect(
                    f"{self._path.resolve().as_uri()}?mode=rw", uri=True, check_same_thread=False
                )
                conn.row_factory = sqlite3.Row
                conn.execute("PRAGMA busy_timeout = 2000")
                self._conn, self._opened = conn, (found.st_dev, found.st_ino)
            return self._conn

    def verify(self, presented: str, now: float | None = None) -> ApiKey | None:
        """The key's record if ``presented`` is a live key, else None. Constant-time."""
        match = _KEY.match(presented)
        if not match:
            return None
        row = self._lookup(match.group(1))
        if row is _UNREADABLE:
            return self._box_key(presented)
        salt = row["salt"] if row else bytes(16)  # an unknown id costs the same work
        expected = row["digest"] if row else bytes(32)
        ok = hmac.compare_digest(_digest(salt, match.group(2)), expected)
        if not row or not ok:
            return None
        key = _row(row)
        if key.is_box_key and key.revoked_at is not None:
            self._revoked.add(key.key_id)
        return key if key.active(now if now is not None else time.time()) else None

    def current(self, key_id: str, now: float | None = None) -> ApiKey | None:
        """The record of ``key_id`` while it is live (not revoked, not expired), else None: a
        dashboard session's key, proven once at sign-in, asked again on each use. While the
        store cannot be read, only the box key's id answers (and only while its file holds
        it), as ``verify`` lets only the box key in then."""
        row = self._lookup(key_id)
        if row is _UNREADABLE:
            return self._box_key_by_id(key_id)
        if not row:
            return None
        key = _row(row)
        return key if key.active(now if now is not None else time.time()) else None

    def _box_key_by_id(self, key_id: str) -> ApiKey | None:
        if self._box_key_file is None or key_id in self._revoked:
            return None
        try:
            match = _KEY.match(self._box_key_file.read_text().strip())
        except OSError:
            return None
        if not match or not hmac.compare_digest(match.group(1), key_id):
            return None
        return ApiKey(key_id, "box key", ("admin",), None, LONG_AGO, None, None, True)

    def _box_key(self, presented: str) -> ApiKey | None:
        """The box key, when ``presented`` is the one in its file (and not seen revoked)."""
        if self._box_key_file is None:
            return None
        try:
            kept = self._box_key_file.read_text().strip()
        except OSError:
            return None
        match = _KEY.match(kept)
        if not match or match.group(1) in self._revoked:
            return None
        if not hmac.compare_digest(kept.encode(), presented.encode()):
            return None
        return ApiKey(match.group(1), "box key", ("admin",), None, LONG_AGO, None, None, True)

    def _lookup(self, key_id: str) -> Any:
        """The stored row of ``key_id`` (read by name), or None; ``_UNREADABLE`` when the
        store cannot be read (only the box key's file opens then). The central's PostgreSQL
        store overrides this (None for an unreadable store: it fails closed)."""
        try:
            conn = self._connection()
            if conn is None:
                return _UNREADABLE
            return conn.execute("SELECT * FROM api_keys WHERE key_id = ?", (key_id,)).fetchone()
        except sqlite3.Error:
            return _UNREADABLE

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
