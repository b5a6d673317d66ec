"""A full drive loses nothing: the store sets aside only a file that is damaged, never one a
full drive could not open.

The drive is a real 20 MB tmpfs each test mounts (``drive``; skipped where a mount is
refused): an open that SQLITE_FULL injection cannot reach (a page cap is per connection).
"""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

import pytest

from fitbox.store.db import CallStart, Store
from fitbox.store.keys import create_key, list_keys

from .small_drive import SmallDrive


def calls(store: Store) -> list[dict[str, Any]]:
    return list(reversed(asyncio.run(store.recent_calls(limit=10_000))))


def test_an_intact_store_a_full_drive_cannot_open_is_left_whole(drive: SmallDrive) -> None:
    path = drive.path / "home" / "fitbox.sqlite3"
    store = Store(path)
    store.run(lambda conn: create_key(conn, "mine", ("inference",)))
    call = store.call_started(CallStart("r1", "/v1/chat/completions", "m", False, 1.0))
    store.call_updated(call, outcome="ok")
    store.close()
    original = path.read_bytes()
    drive.fill()
    with pytest.raises(sqlite3.OperationalError, match="Free space there") as refused:
        Store(path)  # WAL needs its -shm and -wal: the full drive refuses them
    assert str(path) in str(refused.value) and "free on the drive" in str(refused.value)
    assert not [p for p in path.parent.iterdir() if "damaged" in p.name]  # nothing set aside
    assert path.read_bytes() == original
    drive.free()
    again = Store(path)
    try:
        assert again.set_aside is None
        assert [k.name for k in again.run(list_keys)] == ["mine"]
        assert [(c["request_id"], c["outcome"]) for c in calls(again)] == [("r1", "ok")]
    finally:
        again.close()


def test_a_new_store_on_a_full_drive_raises_a_sentence(drive: SmallDrive) -> None:
    drive.fill()
    with pytest.raises(sqlite3.OperationalError, match="Free space there"):
        Store(drive.path / "new" / "fitbox.sqlite3")
