"""Why the store could not do something: the drive (a retry can succeed; nothing is wrong
with the file) or the file itself (damage: it fails its check when it could be read)."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

from fitbox.units import format_bytes

# why a write can fail without anything being wrong with the file or the job
RESOURCE_CODES = frozenset(
    {
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_READONLY,
        sqlite3.SQLITE_PERM,
        sqlite3.SQLITE_BUSY,
        sqlite3.SQLITE_LOCKED,
        sqlite3.SQLITE_NOMEM,
        sqlite3.SQLITE_PROTOCOL,
        sqlite3.SQLITE_NOLFS,
    }
)
DAMAGE_CODES = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})


def primary_code(exc: BaseException) -> int | None:
    """SQLite's primary result code of ``exc`` (extended codes carry it in the low byte)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


def is_resource_failure(exc: BaseException) -> bool:
    """True when the drive, not the file or the job, refused: retrying can succeed."""
    return isinstance(exc, OSError | StoreUnavailable) or primary_code(exc) in RESOURCE_CODES


def drive_free(path: Path) -> int | None:
    """Bytes free on the drive holding ``path`` (its nearest existing folder)."""
    for folder in (path, *path.parents):
        if folder.exists():
            try:
                return shutil.disk_usage(folder).free
            except OSError:
                return None
    return None


class StoreUnavailable(sqlite3.OperationalError):
    """The store could not be opened or written for a reason outside its file: a full
    drive, an I/O error, no permission. Never damage, so nothing was moved or discarded.
    A ``sqlite3.Error``, so every caller that tolerates a store failure tolerates this."""

    def __init__(self, path: Path, doing: str, cause: BaseException) -> None:
        self.path, self.cause = path, cause
        self.full = primary_code(cause) == sqlite3.SQLITE_FULL or (
            isinstance(cause, OSError) and cause.errno == 28  # ENOSPC
        )
        free = drive_free(path)
        where = (
            f"{format_bytes(free)} free on the drive holding it"
            if free is not None
            else ("its drive cannot be read")
        )
        self.reason = (
            f"fitbox could not {doing} its store {path} ({cause}); {where}. Free "
            "space there (or fix the drive's permissions), then try again"
        )
        super().__init__(self.reason)
        self.sqlite_errorcode = getattr(cause, "sqlite_errorcode", sqlite3.SQLITE_IOERR)
