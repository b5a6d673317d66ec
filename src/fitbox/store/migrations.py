"""Numbered ``NNNN_name.sql`` files applied in order, each in a transaction, recorded."""

from __future__ import annotations

import re
import sqlite3
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


class SchemaTooNew(RuntimeError):
    pass


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def migrations_dir() -> Path:
    """Shipped inside the wheel as fitbox/migrations; in a source tree, the top-level dir."""
    packaged = Path(str(resources.files("fitbox"))) / "migrations"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[3] / "migrations"


def load_migrations(directory: Path | None = None) -> list[Migration]:
    directory = directory or migrations_dir()
    found = []
    for path in sorted(directory.glob("*.sql")):
        match = _NAME.match(path.name)
        if match:
            found.append(
                Migration(int(match.group(1)), match.group(2), path.read_text(encoding="utf-8"))
            )
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise RuntimeError(f"two migrations share a number in {directory}")
    return found


class Migratable(Protocol):
    """What migrate() needs of a connection: sqlite3's, or the central's PostgreSQL one
    (central/backend.py), so both keep the same ``schema_migrations`` bookkeeping."""

    def execute(self, sql: str, parameters: Any = ..., /) -> Any: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, kind: Any, value: Any, traceback: Any, /) -> Any: ...


def migrate(conn: Migratable, migrations: list[Migration]) -> list[int]:
    """Apply what is missing; refuse a database newer than this fitbox. Returns applied."""
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations ("
        "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
    )
    applied = {row[0] for row in conn.execute("SELECT version FROM schema_migrations")}
    known = {m.version for m in migrations}
    newer = sorted(v for v in applied if v not in known and v > max(known, default=0))
    if newer:
        raise SchemaTooNew(
            f"the store's schema has migration {newer[-1]}, newer than this fitbox knows "
            f"({max(known, default=0)}); upgrade fitbox or point FITBOX_HOME elsewhere"
        )
    done = []
    for migration in migrations:
        if migration.version in applied:
            continue
        with conn:  # one transaction per migration
            conn.execute("BEGIN")
            for statement in _statements(migration.sql):
                conn.execute(statement)
            conn.execute(
                "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                (migration.version, migration.name, time.time()),
            )
        done.append(migration.version)
    return done


def _statements(sql: str) -> list[str]:
    """Split a migration into statements (``executescript`` would commit mid-transaction)."""
    statements, buffer = [], ""
    for line in sql.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            if buffer.strip():
                statements.append(buffer)
            buffer = ""
    if buffer.strip() and not buffer.strip().startswith("--"):
        statements.append(buffer)
    return statements
