"""Model paths fitbox's store saw before: what it launched, pulled or hashed. Evidence that
is historical (the file may have moved since); scout labels it so."""

from __future__ import annotations

import sqlite3
import time


def _when(at: float | None) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(at)) if at else "once"


def past_paths(conn: sqlite3.Connection) -> list[tuple[str, str]]:
    """(path, what the store says of it), one per path, the newest word first."""
    found: dict[str, str] = {}
    queries = (
        (
            "SELECT artifact, MAX(started_at) FROM children WHERE artifact IS NOT NULL "
            "GROUP BY artifact",
            "fitbox launched it ({when})",
        ),
        (
            "SELECT path, MAX(at) FROM pulls WHERE path IS NOT NULL AND outcome = 'ok' "
            "GROUP BY path",
            "fitbox pulled it ({when})",
        ),
        ("SELECT path, MAX(hashed_at) FROM file_hashes GROUP BY path", "fitbox hashed it ({when})"),
    )
    for sql, words in queries:
        try:
            rows = conn.execute(sql).fetchall()
        except sqlite3.Error:  # a store older than the table: nothing to say
            continue
        for path, at in rows:
            found.setdefault(str(path), "fitbox's store: " + words.format(when=_when(at)))
    return sorted(found.items())
