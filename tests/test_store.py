"""The store's first cut: migrations recorded, calls written, crashes closed as interrupted."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.routing import Route
from starlette.testclient import TestClient

from fitbox.server.manage import telemetry
from fitbox.store import writer
from fitbox.store.db import CallStart, Store, connect
from fitbox.store.migrations import Migration, SchemaTooNew, load_migrations, migrate
from fitbox.store.settings import StoredSetting, read_settings, write_settings
from tests.support.holds import until


def test_migrations_are_recorded_and_applied_once(tmp_path: Path) -> None:
    conn = connect(tmp_path / "s.sqlite3")
    first = migrate(conn, load_migrations())
    everything = [m.version for m in load_migrations()]
    assert first == everything and everything[:4] == [1, 2, 3, 4]
    assert migrate(conn, load_migrations()) == []
    versions = [r[0] for r in conn.execute("SELECT version FROM schema_migrations")]
    assert versions == everything
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_an_older_store_is_upgraded_with_its_rows_intact(tmp_path: Path) -> None:
    conn = connect(tmp_path / "s.sqlite3")
    migrate(conn, load_migrations()[:1])  # a store written by a fitbox that knew only 0001
    conn.execute(
        "INSERT INTO call_log (request_id, endpoint, received_at, outcome)"
        " VALUES ('old', '/v1/completions', 1.0, 'ok')"
    )
    assert migrate(conn, load_migrations()) == [m.version for m in load_migrations()][1:]
    assert conn.execute("SELECT request_id FROM call_log").fetchall()[0][0] == "old"
    assert conn.execute("SELECT COUNT(*) FROM measured_footprints").fetchone()[0] == 0


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    conn = connect(tmp_path / "s.sqlite3")
    migrate(conn, [*load_migrations(), Migration(9999, "future", "CREATE TABLE f (x);")])
    with pytest.raises(SchemaTooNew, match="9999"):
        migrate(conn, load_migrations())


def test_a_failing_migration_leaves_nothing_half_done(tmp_path: Path) -> None:
    conn = connect(tmp_path / "s.sqlite3")
    bad = Migration(99, "bad", "CREATE TABLE ok (x);\nINSERT INTO missing VALUES (1);")
    with pytest.raises(sqlite3.OperationalError):
        migrate(conn, [*load_migrations(), bad])
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "ok" not in tables and "call_log" in tables


def test_calls_are_written_and_pending_rows_closed_at_start(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"

    crashed = Store(path)
    done = crashed.call_started(CallStart("r1", "/v1/chat/completions", "m", False, 1.0))
    crashed.call_updated(done, outcome="ok", prompt_tokens=3, completion_tokens=4)
    crashed.call_started(CallStart("r2", "/v1/chat/completions", "m", True, 2.0))
    crashed.flush()  # written, but never closed: r2 is left pending as a crash would leave it
    store = Store(path)
    rows = asyncio.run(store.recent_calls())
    store.close()
    by_id = {r["request_id"]: r for r in rows}
    assert by_id["r1"]["outcome"] == "ok" and by_id["r1"]["completion_tokens"] == 4
    assert by_id["r2"]["outcome"] == "interrupted"


def test_a_failed_write_is_counted_not_raised(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite3")
    first = store.call_started(CallStart("r1", "/x", "m", False, 0.0))
    store.flush()
    store._submit(lambda conn: conn.execute("DROP TABLE call_log"))  # stands in for disk full
    store.call_started(CallStart("r2", "/x", "m", False, 0.0))
    store.call_updated(first, outcome="ok")
    store.flush()
    assert store.write_failures == 2
    store.close()


def test_writes_are_grouped_and_kept_in_order(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite3")
    ids = [store.call_started(CallStart(f"r{i}", "/x", "m", False, float(i))) for i in range(300)]
    for call_id in ids:
        store.call_updated(call_id, outcome="ok", completion_tokens=call_id)
    rows = asyncio.run(store.recent_calls(limit=1000))
    store.close()
    assert len(rows) == 300 and ids == sorted(ids)
    assert all(r["outcome"] == "ok" and r["completion_tokens"] == r["id"] for r in rows)


def test_unknown_columns_are_refused(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite3")
    try:
        with pytest.raises(ValueError, match="not call_log columns"):
            store.call_updated(1, **{"outcome = 'x'; --": 1})
    finally:
        store.close()


@pytest.mark.parametrize("damage", ["garbage", "torn page"])
def test_a_damaged_store_is_set_aside_and_recreated(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "s.sqlite3"
    if damage == "garbage":
        path.write_bytes(b"this was never a database" * 100)
    else:
        store = Store(path)
        for i in range(500):
            store.call_started(CallStart(f"r{i}", "/x", "m" * 200, False, float(i)))
        store.close()
        data = bytearray(path.read_bytes())
        data[4096 * 2 : 4096 * 2 + 512] = b"\xff" * 512  # scribble over a b-tree page
        path.write_bytes(bytes(data))
    original = path.read_bytes()
    store = Store(path)
    try:
        assert store.set_aside is not None and store.set_aside.read_bytes() == original
        assert store.health()["damaged_file_set_aside"] == str(store.set_aside)
        call = store.call_started(CallStart("new", "/x", "m", False, 0.0))
        store.call_updated(call, outcome="ok")
        rows = asyncio.run(store.recent_calls())
        assert [r["request_id"] for r in rows] == ["new"]
    finally:
        store.close()


def test_a_full_disk_is_counted_and_nothing_raises(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite3")
    store._submit(
        lambda conn: conn.execute(  # SQLITE_FULL, the error a full disk raises
            "PRAGMA max_page_count = " + str(conn.execute("PRAGMA page_count").fetchone()[0])
        )
    )
    for i in range(200):
        call = store.call_started(CallStart(f"r{i}", "/x", "m" * 500, False, float(i)))
        store.call_updated(call, outcome="ok")
    store.flush()
    assert store.write_failures > 0
    store.close()


def test_a_job_that_raises_never_stops_the_writer(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite3")

    def broken(conn: sqlite3.Connection) -> None:
        raise ValueError("a caller's own mistake")

    with pytest.raises(ValueError, match="own mistake"):
        store.run(broken)
    call = store.call_started(CallStart("after", "/x", "m", False, 0.0))
    store.call_updated(call, outcome="ok")
    assert [r["request_id"] for r in asyncio.run(store.recent_calls())] == ["after"]
    assert store.write_failures == 0
    store.close()


def test_settings_outlive_the_store_and_none_clears_a_knob(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite3")
    store.run(lambda conn: write_settings(conn, "pair", "smollm2", {"band": 3, "rungs": ["4bit"]}))
    store.run(lambda conn: write_settings(conn, "box", "", {"goal": "fast"}))
    store.run(lambda conn: write_settings(conn, "pair", "smollm2", {"band": None}))
    store.close()
    again = Store(tmp_path / "s.sqlite3")
    try:
        stored = again.run(read_settings)
    finally:
        again.close()
    assert stored == [
        StoredSetting("box", "", "goal", "fast"),
        StoredSetting("pair", "smollm2", "rungs", ["4bit"]),
    ]


def committed_readings(path: Path) -> int:
    """Readings another connection sees: what the writer has committed."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM resource_log").fetchone()[0])


READING = (1.0, "host", 0, 8 << 30, 4 << 30, 0, 12.5, 0)


def test_a_reading_wakes_no_one_yet_rides_with_the_next_job_and_none_is_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four readings a second each woke the writer's thread for a commit of its own while an
    engine computed beside fitbox; now they wait for a job that wakes it anyway, or for one
    of their own ``LAZY_S`` old."""
    monkeypatch.setattr(writer, "LAZY_S", 3600.0)
    store = Store(tmp_path / "s.sqlite3")
    store.flush()  # the writer now waits for a wake-up
    for _ in range(3):
        store.readings([READING])
    assert not store._writer._wake.is_set()  # the cause itself, not a timing
    assert committed_readings(store.path) == 0
    asyncio.run(store.recent_calls())  # a read: what was queued before it goes first
    assert committed_readings(store.path) == 3
    store.readings([READING])
    store.close()  # a stop commits every reading still queued
    assert committed_readings(store.path) == 4


def test_a_reading_left_waiting_wakes_the_writer_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writer, "LAZY_S", 0.0)  # every reading has waited long enough
    store = Store(tmp_path / "s.sqlite3")
    try:
        store.flush()
        store.readings([READING])
        until(lambda: committed_readings(store.path) == 1, "the reading committed")
    finally:
        store.close()


def test_a_replay_of_readings_sees_every_reading_taken_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/v1/telemetry reads on a connection of its own: it commits the queued readings first,
    or the central's mirror would lag the box by up to ``LAZY_S``."""
    monkeypatch.setattr(writer, "LAZY_S", 3600.0)
    store = Store(tmp_path / "s.sqlite3")
    app = Starlette(routes=[Route("/v1/telemetry", telemetry.rows)])
    app.state.store = store
    try:
        store.flush()
        store.readings([READING, (*READING[:1], "gpu0", 1, 8 << 30, 8 << 30, 0, None, None)])
        with TestClient(app) as client:
            page = client.get("/v1/telemetry", params={"table": "resource_log"}).json()
        assert [r["device"] for r in page["rows"]] == ["host", "gpu0"]
    finally:
        store.close()


def test_a_cancelled_wait_for_a_commit_leaves_the_writer_its_future(tmp_path: Path) -> None:
    """A client gone mid-wait cancels the waiting task, never the barrier the writer settles:
    a cancelled one would raise in the writer's thread and stop every later write."""
    store = Store(tmp_path / "s.sqlite3")
    gate = threading.Event()
    store._writer.submit(lambda conn: gate.wait(30))  # the writer, held by the test
    barrier = store.barrier()

    async def cancel_a_wait() -> None:
        waiting = asyncio.create_task(store.committed(barrier, 60.0))
        await asyncio.sleep(0)  # the wait has begun
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting

    asyncio.run(cancel_a_wait())
    gate.set()
    assert barrier.result(timeout=30) is None and not barrier.cancelled()
    call = store.call_started(CallStart("after", "/x", "m", False, 0.0))
    store.call_updated(call, outcome="ok")
    assert [r["request_id"] for r in asyncio.run(store.recent_calls())] == ["after"]
    store.close()
