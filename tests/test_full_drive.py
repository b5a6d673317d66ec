"""A full drive loses nothing: the store opens only what is damaged aside, keeps the writes a
full drive refused until it has room, says so once, and answers a refused change as data.

Two ways to fill the drive: a real 20 MB tmpfs this test mounts (``drive``; skipped where a
mount is refused) and SQLITE_FULL injection (``PRAGMA max_page_count`` on the writer's
connection: every write past the file's current size fails as a full disk fails it), which
runs anywhere.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from fitbox import config
from fitbox.store.db import CallStart, Store
from fitbox.store.keys import create_key, list_keys

from .support.clients import app_client
from .support.small_drive import SmallDrive


def cap_pages(store: Store, pages: int | None = None) -> None:
    """SQLITE_FULL from the next write that needs a page (``None``: the file's size now)."""
    done = store._submit(
        lambda conn: conn.execute(  # an awaited job runs while writes wait
            f"PRAGMA max_page_count = {pages or conn.execute('PRAGMA page_count').fetchone()[0]}"
        ),
        wait=True,
    )
    assert done is not None
    done.result()


def landed(store: Store, bound_s: float = 30.0) -> None:
    """Wait for the writes kept back to land (they are retried every RETRY_S)."""
    deadline = time.monotonic() + bound_s
    while store.health()["writes_waiting"] or not store.health()["writing"]:
        assert time.monotonic() < deadline, f"kept writes never landed: {store.health()}"
        store.flush()
        time.sleep(0.05)


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


def test_writes_a_full_drive_refused_are_kept_and_land_when_it_has_room(
    drive: SmallDrive,
) -> None:
    store = Store(drive.path / "home" / "fitbox.sqlite3")
    try:
        drive.fill()
        ids = [
            store.call_started(CallStart(f"r{i}", "/x", "m", False, float(i))) for i in range(50)
        ]
        for call_id in ids:
            store.call_updated(call_id, outcome="ok", completion_tokens=call_id)
        store.flush()
        health = store.health()
        assert health["write_failures"] >= 100 and health["writes_waiting"] >= 100
        assert not health["writing"] and health["writes_lost"] == 0
        [problem] = store.problems()
        assert "is full" in problem and "Free space on it" in problem
        with pytest.raises(sqlite3.OperationalError, match="Free space there") as refused:
            store.run(lambda conn: create_key(conn, "during", ("inference",)))
        assert getattr(refused.value, "full", False)
        drive.free()
        landed(store)
        rows = calls(store)
        assert [r["id"] for r in rows] == ids  # every call, in order, none lost
        assert all(r["outcome"] == "ok" and r["completion_tokens"] == r["id"] for r in rows)
        assert store.problems() == [] and store.health()["writes_lost"] == 0
    finally:
        store.close()


def test_writes_refused_by_sqlite_full_are_kept_in_order(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite3")
    try:
        cap_pages(store)
        ids = [
            store.call_started(CallStart(f"r{i}", "/x", "m" * 500, False, float(i)))
            for i in range(200)
        ]
        store.flush()
        # a first small group commit may still fit the last page's slack (how the writer
        # groups them is its own business): most wait, none is lost, all land in order
        health = store.health()
        assert health["writes_waiting"] >= 100 and not health["writing"]
        assert health["writes_lost"] == 0
        cap_pages(store, 1_000_000)
        landed(store)
        assert [r["id"] for r in calls(store)] == ids
    finally:
        store.close()


def test_a_full_disk_is_logged_once_not_per_write(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = Store(tmp_path / "s.sqlite3")
    caplog.set_level(logging.WARNING, logger="fitbox.store.db")
    began = time.monotonic()
    try:
        cap_pages(store)
        deadline = began + 30
        while store.health()["write_failures"] < 20:  # twenty sensor readings' worth
            assert time.monotonic() < deadline
            store.readings([(time.time(), "host", 0, 1, 1, 0, None, None)])
            store.call_started(CallStart("r", "/x", "m" * 500, False, 0.0))
            store.flush()
            time.sleep(0.05)  # a wake-up each, as the sensor loop's would be
        elapsed = time.monotonic() - began
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert 1 <= len(errors) <= 1 + int(elapsed // 60)  # a line a minute at most
        assert "cannot write" in errors[0].getMessage()
    finally:
        store.close()


def test_the_log_throttle_lets_one_line_through_per_interval() -> None:
    from fitbox.store.writer import Throttle

    throttle = Throttle(every=60.0)
    assert throttle.allow(0.0) and not throttle.allow(1.0) and not throttle.allow(59.9)
    assert throttle.allow(60.0) and throttle.held == 2


@pytest.fixture
def full_app(drive: SmallDrive) -> Any:
    """The app with its home on a drive that is then filled to the last byte."""
    cfg = config.load({"home": str(drive.path / "home"), "models": str(drive.path)}, env={})
    with app_client(cfg) as client:
        drive.fill()
        yield client
        drive.free()


@pytest.mark.parametrize(
    ("path", "body"), [("/v1/keys", {"name": "k"}), ("/v1/settings/box", {"goal": "fast"})]
)
def test_a_change_the_store_cannot_keep_is_a_507_that_says_why(
    full_app: TestClient, path: str, body: dict[str, Any]
) -> None:
    reply = full_app.post(path, json=body)
    assert reply.status_code == 507, reply.text
    error = reply.json()["error"]
    assert (error["type"], error["code"]) == ("server_error", "storage_full")
    assert "database or disk is full" in error["message"] and "Free space" in error["message"]
    assert "nothing was changed" in error["message"]
    health = full_app.get("/health").json()
    assert health["status"] == "degraded" and "is full" in health["problems"][0]


def test_a_key_sqlite_full_refuses_is_a_507(tmp_path: Path) -> None:
    cfg = config.load({"home": str(tmp_path / "home"), "models": str(tmp_path)}, env={})
    with app_client(cfg) as client:
        cap_pages(client.app.state.store)  # type: ignore[attr-defined]
        reply = client.post("/v1/keys", json={"name": "k" * 8000})  # needs pages of its own
        assert reply.status_code == 507, reply.text
        assert reply.json()["error"]["code"] == "storage_full"
        assert [k["name"] for k in client.get("/v1/keys").json()["data"]] == ["box key"]
