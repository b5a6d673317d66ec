"""A store file damaged, deleted or replaced under a running store: the writer lives on,
says so, makes a new file with what can still be read, and every later row lands in it."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import pytest

from fitbox import config
from fitbox.store import writer
from fitbox.store.db import CallStart, Store
from fitbox.store.keys import KeyChecker, create_key, find_key

from .support.clients import app_client
from .support.ggufs import write_tiny_llama
from .support.holds import until
from .support.store_faults import checkpointed, delete_store, overwrite_pages, root_page

OUTSIDE = ("203.0.113.5", 5000)  # a peer that needs a key for everything


def _calls(store: Store, count: int, prefix: str) -> list[int]:
    made = []
    for i in range(count):
        call = store.call_started(CallStart(f"{prefix}{i}", "/x", "m" * 200, False, float(i)))
        store.call_updated(call, outcome="ok")
        made.append(call)
    return made


def _rows(path: Path) -> dict[str, str]:
    with sqlite3.connect(path) as conn:
        return dict(conn.execute("SELECT request_id, outcome FROM call_log").fetchall())


def test_a_store_whose_pages_are_overwritten_keeps_writing_into_a_new_file(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.sqlite3"
    store = Store(path)
    try:
        _, secret = store.run(lambda conn: create_key(conn, "kept", ("read",)))
        _calls(store, 300, "before")
        running = store.call_started(CallStart("running", "/x", "m", False, 0.0))
        store.flush()
        checkpointed(path)  # the writer reads the file again at its next transaction
        for table in ("call_log", "events"):  # every write of a call meets the damage
            overwrite_pages(path, root_page(path, table), 1)
        _calls(store, 5, "after")
        store.call_updated(running, outcome="ok")  # a call that ran across the fault ends
        store.flush()
        assert store._writer._thread.is_alive()
        recent = {r["request_id"]: r["outcome"] for r in asyncio.run(store.recent_calls())}
        assert {f"after{i}" for i in range(5)} <= set(recent) and recent["running"] == "ok"
        health = store.health()
        assert "damaged" in (health["file_problem"] or "")
        assert any("damaged" in problem for problem in store.problems())
        aside = Path(health["damaged_file_set_aside"])
        assert aside.exists() and aside != path
        assert store.counter > 300  # event ids go on, never back (cursors follow them)
        key_id = secret.split("_")[1]
        assert store.run(lambda conn: find_key(conn, key_id)) is not None  # salvaged
    finally:
        store.close()
    rows = _rows(path)
    assert all(rows[f"after{i}"] == "ok" for i in range(5)) and rows["running"] == "ok"
    checker = KeyChecker(path)
    assert checker.verify(secret) is not None
    checker.close()


def test_a_store_file_deleted_while_running_is_made_again_with_every_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writer, "CHECK_S", 0.1)  # the store looks at its file often
    monkeypatch.setattr(writer, "LOOK_ALONE_S", 0.2)
    path = tmp_path / "s.sqlite3"
    store = Store(path)
    checker = KeyChecker(path)
    try:
        _, secret = store.run(lambda conn: create_key(conn, "kept", ("read",)))
        _calls(store, 50, "before")
        running = store.call_started(CallStart("running", "/x", "m", False, 0.0))
        store.flush()
        assert checker.verify(secret) is not None
        delete_store(path)
        _calls(store, 5, "during")  # land on the deleted file until the store notices
        assert checker.verify(secret) is not None  # the file still open answers meanwhile
        until(lambda: store.health()["file_problem"], "the store noticed its file was gone")
        assert "deleted" in store.health()["file_problem"]
        assert any("deleted" in problem for problem in store.problems())
        _calls(store, 5, "after")
        store.call_updated(running, outcome="ok")
        store.flush()
        assert store._writer._thread.is_alive()
        assert checker.verify(secret) is not None  # the new file, opened again
    finally:
        checker.close()
        store.close()
    rows = _rows(path)
    for prefix in ("before", "during", "after"):
        assert all(rows[f"{prefix}{i}"] == "ok" for i in range(5)), prefix
    assert rows["running"] == "ok"


def test_a_store_file_replaced_while_running_is_set_aside_and_ours_put_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writer, "CHECK_S", 0.1)  # the store looks at its file often
    monkeypatch.setattr(writer, "LOOK_ALONE_S", 0.2)
    path = tmp_path / "s.sqlite3"
    store = Store(path)
    try:
        _calls(store, 5, "before")
        store.flush()
        stranger = tmp_path / "stranger.sqlite3"
        with sqlite3.connect(stranger) as conn:
            conn.execute("CREATE TABLE api_keys (key_id TEXT)")
        stranger.replace(path)
        until(lambda: store.health()["file_problem"], "the store noticed another file")
        assert "replaced" in store.health()["file_problem"]
        aside = Path(store.health()["damaged_file_set_aside"])
        with sqlite3.connect(aside) as conn:  # the stranger, kept for whoever looks
            assert conn.execute("SELECT name FROM sqlite_schema").fetchall() == [("api_keys",)]
        _calls(store, 5, "after")
        store.flush()
    finally:
        store.close()
    rows = _rows(path)
    assert all(rows[f"{p}{i}"] == "ok" for p in ("before", "after") for i in range(5))


@pytest.mark.parametrize("fault", ["deleted", "damaged"])
def test_a_restart_on_a_lost_store_keeps_the_box_key_and_says_what_was_lost(
    tmp_path: Path, fault: str
) -> None:
    (tmp_path / "models").mkdir()
    write_tiny_llama(tmp_path / "models" / "tiny.gguf")
    cfg = config.load({"home": str(tmp_path), "models": str(tmp_path / "models")}, env={})
    with app_client(cfg):
        pass  # the first start makes the store and the box key
    box_key = cfg.box_key_file.read_text().strip()
    if fault == "deleted":
        delete_store(cfg.store_path)
    else:
        cfg.store_path.write_bytes(b"this was never a database" * 100)
    with app_client(cfg, OUTSIDE) as outside:
        answer = outside.get("/v1/keys", headers={"Authorization": f"Bearer {box_key}"})
        assert answer.status_code == 200, answer.text
        lost = outside.get("/health").json()["store"]["lost_at_start"]
        assert "box key" in lost and "history" in lost
        assert ("set aside" in lost) == (fault == "damaged")
    assert cfg.box_key_file.read_text().strip() == box_key  # never a new one


def test_a_change_listener_that_raises_never_stops_the_writer(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite3")
    heard: list[int] = []

    def closed_loop(counter: int) -> None:  # call_soon_threadsafe once the loop has closed
        raise RuntimeError("Event loop is closed")

    store.on_change(closed_loop)
    store.on_change(heard.append)
    try:
        _calls(store, 3, "first")
        store.flush()
        _calls(store, 3, "then")
        store.flush()
        assert store._writer._thread.is_alive() and heard and heard[-1] == store.counter
        assert {f"then{i}" for i in range(3)} <= set(_rows(store.path))
    finally:
        store.close()


def test_a_wait_cancelled_by_its_caller_never_stops_the_writer(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite3")
    busy, release = threading.Event(), threading.Event()

    def held(conn: sqlite3.Connection) -> None:  # the writer is in here until released
        busy.set()
        release.wait(30)

    try:
        store._submit(held)
        assert busy.wait(30)
        barrier = store.barrier()
        assert barrier.cancel()  # still queued behind the held job: a caller gave up
        release.set()
        _calls(store, 3, "after")
        store.flush()
        assert store._writer._thread.is_alive()
        assert {f"after{i}" for i in range(3)} <= set(_rows(store.path))
    finally:
        release.set()
        store.close()


def test_whatever_a_batch_raises_the_writer_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failures = iter([RuntimeError("a bug no batch should raise")])

    def broken_look(path: Path, opened: object) -> None:  # a fault no real file shows
        raise next(failures, None) or AssertionError("looked once")

    monkeypatch.setattr(writer, "CHECK_S", 0.0)  # a look after every batch
    monkeypatch.setattr(writer, "trouble", broken_look)
    store = Store(tmp_path / "s.sqlite3")
    try:
        _calls(store, 3, "first")
        store.flush()
        monkeypatch.setattr(writer, "trouble", lambda path, opened: None)
        _calls(store, 3, "then")
        store.flush()
        assert store._writer._thread.is_alive()
        assert {f"then{i}" for i in range(3)} <= set(_rows(store.path))
    finally:
        store.close()


def test_a_store_locked_by_another_process_keeps_its_writes_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    store = Store(path)
    store.run(lambda conn: conn.execute("PRAGMA busy_timeout = 50"))  # refused at once
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        _calls(store, 3, "locked")
        store.flush()
        assert store._writer._thread.is_alive() and not store.health()["writing"]
        said = [problem for problem in store.problems() if "cannot write" in problem]
        assert said and "Another connection holds its write lock" in said[0], said
        other.execute("ROLLBACK")

        def landed() -> bool:
            store.flush()
            return bool(store.health()["writing"])

        until(landed, "the kept writes landed once the lock was let go")
        assert {f"locked{i}" for i in range(3)} <= set(_rows(path))
        assert store.health()["file_problem"] is None  # a lock is not a lost file
    finally:
        other.close()
        store.close()
