"""Operator settings in the store's ``settings`` table: one row per knob, the value as JSON.

Parsing and merging the knobs is box/preferences.py's; this module only reads and writes the
rows, with the connection it is handed (the store's writer thread, inside its transaction).
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StoredSetting:
    scope: str  # box | pair | limits
    model: str  # the model name for scope = pair, else ''
    name: str
    value: Any  # decoded from its JSON


def read_settings(conn: sqlite3.Connection) -> list[StoredSetting]:
    """Every stored knob, in (scope, model, name) order."""
    rows = conn.execute(
        "SELECT scope, model, name, value FROM settings ORDER BY scope, model, name"
    )
    return [
        StoredSetting(scope, model, name, json.loads(value)) for scope, model, name, value in rows
    ]


def write_settings(
    conn: sqlite3.Connection, scope: str, model: str, values: dict[str, Any]
) -> None:
    """Store ``values`` for one scope and model; a ``None`` value deletes that knob's row."""
    now = time.time()
    for name, value in values.items():
        if value is None:
            conn.execute(
                "DELETE FROM settings WHERE scope = ? AND model = ? AND name = ?",
                (scope, model, name),
            )
        else:
            conn.execute(
                "INSERT INTO settings (scope, model, name, value, updated_at) VALUES "
                "(?, ?, ?, ?, ?) ON CONFLICT (scope, model, name) DO UPDATE SET "
                "value = excluded.value, updated_at = excluded.updated_at",
                (scope, model, name, json.dumps(value), now),
            )
