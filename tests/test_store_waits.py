"""Store work a request waits on (store/waits.py): off the event loop, bounded, and a write
its caller was told was not made never lands. Real stores, real locks taken by the test's
own sqlite3 connection; the one fake is a read that hangs (a hung drive) on an event the
test sets."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from fitbox import config
from fitbox.errors import StoreBusy
from fitbox.server.door.errors import body_for
from fitbox.server.views.tally import Tally
from fitbox.store import keys, waits
from fitbox.store.db import Store

from .support.clients import app_client, assert_error

HOLD_S = 30.0  # a failure bound: how long a held read or lock may wait for the test


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store(tmp_path / "fitbox.sqlite3")
    try:
        yield opened
    finally:
        opened.close()


@contextlib.contextmanager
def write_lock(path: Path) -> Iterator[sqlite3.Connection]:
    """The store's write lock, held by a connection of the test's own (an operator's
    sqlite3 in a transaction) until the block ends."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN EXCLUSIVE")
        yield conn
    finally:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        conn.close()


def key_names(path: Path) -> list[str]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return [k.name for k in keys.list_keys(conn)]


def test_a_write_its_caller_stopped_waiting_for_never_lands(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key's INSERT waits on the lock inside the writer when its caller gives up; the
    lock then goes, the INSERT goes through, and the savepoint takes it back."""
    monkeypatch.setattr(waits, "STORE_WAIT_S", 0.2)
    with write_lock(store.path), pytest.raises(StoreBusy) as refused:
        asyncio.run(waits.write(store, lambda conn: keys.create_key(conn, "refused", ("read",))))
    assert refused.value.retry and refused.value.retry_after == waits.RETRY_AFTER_S
    assert refused.value.status == 503 and refused.value.code == "store_busy"
    # the store's path is the box's own: an outsider's message goes without it
    outsider = body_for(refused.value, insider=False)["error"]["message"]
    assert str(store.path) not in outsider and "shown to the box itself" in outsider
    assert str(store.path) in body_for(refused.value, insider=True)["error"]["message"]
    store.flush(timeout=HOLD_S)
    made = asyncio.run(waits.write(store, lambda conn: keys.create_key(conn, "after", ("read",))))
    assert made[0].name == "after"
    assert key_names(store.path) == ["after"]


def test_a_read_that_does_not_answer_in_time_is_store_busy_and_the_loop_goes_on(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(waits, "STORE_WAIT_S", 0.2)
    hung, entered = threading.Event(), threading.Event()

    def stuck(conn: sqlite3.Connection) -> None:
        entered.set()
        hung.wait(HOLD_S)

    async def both() -> int:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)  # only a loop left free gets here again

        ticker = asyncio.get_running_loop().create_task(tick())
        try:
            with pytest.raises(StoreBusy):
                await waits.read(store.path, stuck, "read it")
        finally:
            ticker.cancel()
        return ticks

    try:
        ticks = asyncio.run(both())
    finally:
        hung.set()
    assert entered.is_set() and ticks > 1


def test_reads_go_on_while_another_connection_holds_the_write_lock(store: Store) -> None:
    asyncio.run(waits.write(store, lambda conn: keys.create_key(conn, "kept", ("read",))))
    with write_lock(store.path):
        found = asyncio.run(waits.read(store.path, keys.list_keys))
        assert waits.lock_holder(store.path)
    assert [k.name for k in found] == ["kept"]
    assert not waits.lock_holder(store.path)


def test_a_damaged_store_read_is_an_error_a_person_can_act_on(tmp_path: Path) -> None:
    path = tmp_path / "garbage.sqlite3"
    path.write_bytes(b"not a database, " * 512)
    with pytest.raises(Exception) as failed:
        asyncio.run(waits.read(path, keys.list_keys, "list the keys"))
    assert getattr(failed.value, "code", None) == "store_unreadable"
    assert str(path) in str(failed.value) and "list the keys" in str(failed.value)


def test_a_stuck_writer_refuses_changes_with_503_and_health_says_so(tmp_path: Path) -> None:
    """The writer's thread held by a job that waits on the test (a hung drive): a key
    answers 503 store_busy and is never made, reads and /health answer, and /health names
    the late writer. On main the key's handler held the loop for 30 s and answered 500."""
    models = tmp_path / "models"
    models.mkdir()
    cfg = config.load({"home": str(tmp_path / "home"), "models": str(models)}, env={})
    stuck = threading.Event()
    with app_client(cfg) as client:
        store: Store = client.app.state.store  # type: ignore[attr-defined]
        store._submit(lambda conn: stuck.wait(HOLD_S))
        try:
            refused = client.post("/v1/keys", json={"name": "refused"})
            assert_error(refused, 503, "store_busy")
            assert int(refused.headers["retry-after"]) >= 1
            said = refused.json()["error"]["message"]  # the box itself: its store's path
            assert said.endswith(f"The store is {store.path}.") and "operator_reason" not in said
            assert client.get("/v1/keys").status_code == 200
            deadline = time.monotonic() + HOLD_S  # a failure bound: the writer is late by then
            while not any("has not finished a write" in p for p in health(client)["problems"]):
                assert time.monotonic() < deadline, health(client)
        finally:
            stuck.set()
        store.flush(timeout=HOLD_S)
        assert "refused" not in [k["name"] for k in client.get("/v1/keys").json()["data"]]
        assert health(client)["status"] == "ok"


def health(client: Any) -> dict[str, Any]:
    response = client.get("/health")
    assert response.status_code == 200
    body: dict[str, Any] = response.json()
    return body


def test_a_key_check_the_store_does_not_answer_is_503_and_holds_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key's row read held by the test (a hung drive): the keyed request answers 503
    store_busy once the store's bound passes, and /health answers while the read still
    hangs. On main the door read the key on the event loop: both waited for the drive."""
    models = tmp_path / "models"
    models.mkdir()
    cfg = config.load({"home": str(tmp_path / "home"), "models": str(models)}, env={})
    hung, entered = threading.Event(), threading.Event()
    looked_up = keys.KeyChecker._lookup

    def held(self: keys.KeyChecker, key_id: str) -> Any:
        entered.set()
        hung.wait(HOLD_S)
        return looked_up(self, key_id)

    with app_client(cfg) as client, ThreadPoolExecutor(2) as pool:
        made = client.post("/v1/keys", json={"name": "app", "scopes": ["read"]})
        bearer = {"authorization": f"Bearer {made.json()['key']}"}
        monkeypatch.setattr(waits, "STORE_WAIT_S", 0.2)  # the bound the door waits within
        monkeypatch.setattr(keys.KeyChecker, "_lookup", held)
        try:
            keyed = pool.submit(client.get, "/v1/telemetry/tables", headers=bearer)
            assert entered.wait(HOLD_S)
            assert_error(keyed.result(timeout=HOLD_S), 503, "store_busy")
            assert pool.submit(health, client).result(timeout=HOLD_S)["service"] == "fitbox"
            assert not hung.is_set()  # the key's read still hangs, and nothing waited for it
        finally:
            hung.set()
        monkeypatch.setattr(keys.KeyChecker, "_lookup", looked_up)
        assert client.get("/v1/telemetry/tables", headers=bearer).status_code == 200


def test_a_metrics_scrape_the_store_does_not_answer_is_503(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scrape's count of new rows held by the test (a hung drive): /metrics answers 503
    store_busy once the store's bound passes, instead of hanging the scrape."""
    models = tmp_path / "models"
    models.mkdir()
    cfg = config.load({"home": str(tmp_path / "home"), "models": str(models)}, env={})
    hung = threading.Event()
    caught_up = Tally.catch_up

    def held(self: Tally, *args: Any) -> None:
        hung.wait(HOLD_S)
        caught_up(self, *args)

    with app_client(cfg) as client:
        assert client.get("/metrics").status_code == 200
        monkeypatch.setattr(waits, "STORE_WAIT_S", 0.2)
        monkeypatch.setattr(Tally, "catch_up", held)
        try:
            assert_error(client.get("/metrics"), 503, "store_busy")
        finally:
            hung.set()
