"""The central's door and parts without an engine: who may register, the reasons a
registration is refused, what a worker key cannot do, the errors of its routes, and which
rows the mirror keeps raw. The central app runs in process (no box is needed to refuse).
Everything that touches the store runs on both stores: a SQLite file and a database in a
real PostgreSQL server the tests start (tests/support/postgres.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from fitbox import config as settings
from fitbox.central.app import create_central_app
from fitbox.central.backend import StoreTarget, StoreUnavailable, redact, to_postgres
from fitbox.central.identity import BoxIdentityRefused
from fitbox.central.mirror import last_known_models
from fitbox.central.store import BoxRecord, CentralStore, rejection
from fitbox.cli import main as fitbox_main
from fitbox.cli.central import CENTRAL_SCOPES
from fitbox.server.manage.joining import Registration
from fitbox.store.keys import create_key

from .support.holds import Background, until
from .support.paths import BOX as HOST
from .support.postgres import PostgresCluster

OUTSIDE = ("203.0.113.9", 50000)  # a documentation address: never the central itself
BOX = {
    "box_id": "0b7c1d2e-0000-4000-8000-000000000001",
    "name": "gpu-1",
    "version": "0.1.0",
    "url": "http://198.51.100.7:8484",
    "admin_key": "fb_000000000000_" + "x" * 43,
}


def _key(target: StoreTarget, *scopes: str) -> str:
    store = CentralStore(target)
    try:
        _, secret = store.run(lambda conn: create_key(conn, "t", scopes, known=CENTRAL_SCOPES))
    finally:
        store.close()
    return str(secret)


@pytest.fixture(params=["sqlite", "postgres"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> StoreTarget:
    """Where a central's store is: a new SQLite file, or a new PostgreSQL database."""
    if request.param == "sqlite":
        return tmp_path / "central.sqlite3"
    cluster: PostgresCluster = request.getfixturevalue("postgres")
    return cluster.create_database()


@pytest.fixture
def central(tmp_path: Path, target: StoreTarget) -> Iterator[tuple[TestClient, StoreTarget]]:
    """A central listening on every address, called from outside it."""
    config = settings.load({"home": str(tmp_path), "host": "0.0.0.0"}, env={})
    CentralStore(target).close()
    with TestClient(create_central_app(config, target), client=OUTSIDE) as client:
        yield client, target


def _error(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == code and error["message"] and "type" in error and "param" in error
    return error


def test_registering_from_outside_needs_the_worker_key(
    central: tuple[TestClient, StoreTarget],
) -> None:
    client, _ = central
    error = _error(client.post("/v1/boxes", json=BOX), 401, "missing_api_key")
    assert "--central-key" in error["message"]
    bad = {"Authorization": "Bearer fb_000000000000_" + "y" * 43}
    _error(client.post("/v1/boxes", json=BOX, headers=bad), 401, "invalid_api_key")


def test_an_inference_key_cannot_register(central: tuple[TestClient, StoreTarget]) -> None:
    client, store_path = central
    key = _key(store_path, "inference")
    error = _error(
        client.post("/v1/boxes", json=BOX, headers={"Authorization": f"Bearer {key}"}),
        403,
        "insufficient_scope",
    )
    assert "worker" in error["message"]


def test_a_worker_key_registers_and_can_do_nothing_else(
    central: tuple[TestClient, StoreTarget],
) -> None:
    client, store_path = central
    auth = {"Authorization": f"Bearer {_key(store_path, 'worker')}"}
    taken = client.post("/v1/boxes", json=BOX, headers=auth)
    answer = taken.json()
    proof = answer.pop("box_secret")
    assert taken.status_code == 201 and answer == {
        "box_id": BOX["box_id"],
        "registered": True,
        "moved": True,
    }
    mine = {**BOX, "box_secret": proof}
    again = client.post("/v1/boxes", json=mine, headers=auth)  # same address: not moved
    assert again.status_code == 200 and again.json()["moved"] is False
    assert "box_secret" not in again.json()  # told once
    moved = client.post("/v1/boxes", json={**mine, "url": "http://198.51.100.7:9000"}, headers=auth)
    assert moved.status_code == 201 and moved.json()["moved"] is True
    for path in ("/v1/fleet", "/v1/telemetry/tables", "/v1/models"):
        _error(client.get(path, headers=auth), 403, "insufficient_scope")
    admin = {"Authorization": f"Bearer {_key(store_path, 'admin')}"}
    fleet = client.get("/v1/fleet", headers=admin).json()["data"]
    assert [b["url"] for b in fleet] == ["http://198.51.100.7:9000"]  # one box, moved
    assert "admin_key" not in fleet[0]


def test_a_worker_key_and_a_known_box_id_cannot_take_the_box_over(
    central: tuple[TestClient, StoreTarget], caplog: pytest.LogCaptureFixture
) -> None:
    """Box ids are public and the worker key is on every box's command line: a register
    naming a known id from elsewhere without that box's secret (or with a wrong one) is
    refused, logged once, and the box on record keeps its address and key."""
    client, store_path = central
    auth = {"Authorization": f"Bearer {_key(store_path, 'worker')}"}
    assert client.post("/v1/boxes", json=BOX, headers=auth).status_code == 201
    thief = {**BOX, "url": "http://203.0.113.66:8484", "admin_key": "fb_thief"}
    for attempt in (thief, thief, {**thief, "box_secret": "fbx_box_guessed"}):
        error = _error(
            client.post("/v1/boxes", json=attempt, headers=auth), 403, "box_identity_unproven"
        )
        assert BOX["url"] in error["message"] and error["param"] == "box_id"
        assert "fitbox central boxes remove" in error["message"]
    logged = [r for r in caplog.records if "registration refused" in r.getMessage()]
    assert len(logged) == 1, logged  # once per (box, address), however often it asks
    (record,) = _stored_boxes(store_path)
    assert (record.url, record.admin_key) == (BOX["url"], BOX["admin_key"])


def test_a_box_registered_before_secrets_gets_one_from_its_own_address_only(
    target: StoreTarget,
) -> None:
    store = CentralStore(target)
    try:
        store.register("old", "n", "0.1", "http://198.51.100.3:1", "k")
        store.run(lambda conn: conn.execute("UPDATE boxes SET secret_hash = NULL"))
        with pytest.raises(BoxIdentityRefused, match="no secret on record"):
            store.register("old", "n", "0.1", "http://203.0.113.66:1", "stolen")
        minted = store.register("old", "n", "0.2", "http://198.51.100.3:1", "k")
        assert minted.secret is not None and minted.moved is False
        with pytest.raises(BoxIdentityRefused):  # now it needs it, or its box key
            store.register("old", "n", "0.2", "http://198.51.100.3:1", "another key")
        # the answer that told it lost: the same address and box key are given another
        lost = store.register("old", "n", "0.2", "http://198.51.100.3:1", "k")
        assert lost.secret not in (None, minted.secret)
        with pytest.raises(BoxIdentityRefused):
            store.register("old", "n", "0.2", "http://198.51.100.3:1", "k", minted.secret)
        minted = lost
        moved = store.register("old", "n", "0.2", "http://198.51.100.4:1", "k", minted.secret)
        assert moved.moved and moved.secret is None
        (record,) = store.boxes()
        assert record.url == "http://198.51.100.4:1" and "secret_hash" not in record.public()
    finally:
        store.close()


def _stored_boxes(target: StoreTarget) -> list[BoxRecord]:
    store = CentralStore(target)
    try:
        return store.boxes()
    finally:
        store.close()


def test_a_loopback_box_is_refused_by_a_central_elsewhere(
    central: tuple[TestClient, StoreTarget],
) -> None:
    client, store_path = central
    auth = {"Authorization": f"Bearer {_key(store_path, 'worker')}"}
    loopback = {**BOX, "url": "http://127.0.0.1:8484"}
    error = _error(client.post("/v1/boxes", json=loopback, headers=auth), 400, "box_unreachable")
    assert "--host 0.0.0.0" in error["message"] and error["param"] == "url"
    error = _error(
        client.post("/v1/boxes", json={**BOX, "url": ""}, headers=auth), 400, "invalid_request"
    )
    assert error["param"] == "url"


def test_the_box_sees_a_loopback_problem_before_asking() -> None:
    reg = Registration("http://198.51.100.1:8484", "k", "id", "n", "http://127.0.0.1:1", "b")
    assert "loopback only" in (reg.loopback_problem() or "")
    same_host = Registration("http://127.0.0.1:9", "k", "id", "n", "http://127.0.0.1:1", "b")
    assert same_host.loopback_problem() is None


def test_the_routes_errors_are_openai_shaped(central: tuple[TestClient, StoreTarget]) -> None:
    client, store_path = central
    auth = {"Authorization": f"Bearer {_key(store_path, 'admin')}"}
    error = _error(
        client.post(
            "/v1/chat/completions", json={"model": "nothing", "messages": []}, headers=auth
        ),
        404,
        "model_not_found",
    )
    assert "GET /v1/models" in error["message"]
    _error(
        client.post("/v1/chat/completions", json={"messages": []}, headers=auth),
        400,
        "invalid_request",
    )
    _error(client.post("/v1/embeddings", content=b"{", headers=auth), 400, "invalid_request")
    error = _error(
        client.get("/v1/telemetry/rows", params={"table": "api_keys"}, headers=auth),
        400,
        "invalid_request",
    )
    assert error["param"] == "table"
    _error(
        client.get("/v1/telemetry/rows", params={"table": "call_log", "limit": "x"}, headers=auth),
        400,
        "invalid_request",
    )


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"id": 1, "seq": 2, "prompt_tokens": "many"}, "prompt_tokens"),
        ({"id": "1", "seq": 2}, "'id'"),
        ({"id": 1}, "'seq'"),
        ({"id": 1, "seq": 2, "devices": [0]}, "devices"),
        (["not", "a", "row"], "JSON object"),
        ({"id": 2**63, "seq": 2}, "64 bits"),  # past what either store's integer holds
    ],
)
def test_rows_the_mirror_cannot_take_say_why(row: Any, reason: str) -> None:
    assert reason in (rejection(row, "seq") or "")


def test_a_row_the_mirror_can_take() -> None:
    assert (
        rejection(
            {
                "id": 1,
                "seq": 2,
                "prompt_tokens": 5,
                "outcome": "ok",
                "received_at": 1.5,
                "evicted": None,
            },
            "seq",
        )
        is None
    )


def test_a_page_lands_once_and_a_changed_row_replaces_itself(target: StoreTarget) -> None:
    store = CentralStore(target)
    try:
        assert (
            store.take_page(
                "b",
                "call_log",
                "seq",
                [{"id": 1, "seq": 1, "outcome": "pending"}, {"id": 2, "seq": 2, "x_at": "no"}],
                2,
            )
            == 1
        )
        store.take_page("b", "call_log", "seq", [{"id": 1, "seq": 3, "outcome": "ok"}], 3)
        rows = store.mirrored("call_log", "b", 10, 0, False)
        assert rows == [{"box_id": "b", "id": 1, "seq": 3, "outcome": "ok"}]
        assert store.cursor("b", "call_log") == 3
        assert [r["source_id"] for r in store.rejects(10, 0)] == ["2"]
        store.take_page("b", "call_log", "seq", [{"id": 2, "seq": 4, "x_at": 1.0}], 4)
        assert store.rejects(10, 0) == []  # the row, fixed on the box, is mirrored instead
    finally:
        store.close()


def test_a_central_url_that_is_not_http_is_refused_with_the_setting_named() -> None:
    with pytest.raises(settings.ConfigError, match="FITBOX_CENTRAL_URL"):
        settings.load({}, env={"FITBOX_CENTRAL_URL": "central.example:8484"})
    loaded = settings.load({}, env={"FITBOX_CENTRAL_URL": "http://10.0.0.5:8484/"})
    assert loaded.central_url == "http://10.0.0.5:8484"


def _versions(store: CentralStore) -> list[int]:
    return list(
        store.run(
            lambda conn: [
                int(r[0])
                for r in conn.execute("SELECT version FROM schema_migrations ORDER BY version")
            ]
        )
    )


def test_one_migration_sequence_is_recorded_and_not_run_twice(target: StoreTarget) -> None:
    store = CentralStore(target)
    first = _versions(store)
    store.close()
    assert first and first[0] == 1  # migrations/central/, the same on both stores
    again = CentralStore(target)  # opened again: nothing is applied a second time
    try:
        assert _versions(again) == first
        timed = again.run(
            lambda conn: conn.execute("SELECT applied_at FROM schema_migrations").fetchone()[0]
        )
        assert isinstance(timed, float) and abs(timed - time.time()) < 3600  # a double, not float4
    finally:
        again.close()


def test_a_page_and_its_cursor_land_together_or_not_at_all(target: StoreTarget) -> None:
    store = CentralStore(target)
    try:
        store.take_page("b", "call_log", "seq", [{"id": 1, "seq": 1}], 1)

        def half_done(conn: Any) -> None:
            conn.execute("UPDATE mirror_cursors SET cursor = 99 WHERE box_id = 'b'")
            raise RuntimeError("the writer died mid-page")

        with pytest.raises(RuntimeError, match="mid-page"):
            store.run(half_done)
        assert store.cursor("b", "call_log") == 1
        huge = {"id": 2**63, "seq": 2}  # kept raw, and the rest of the page lands
        assert store.take_page("b", "call_log", "seq", [huge, {"id": 2, "seq": 3}], 3) == 1
        assert [r["id"] for r in store.mirrored("call_log", "b", 10, 0, False)] == [1, 2]
        assert store.cursor("b", "call_log") == 3
    finally:
        store.close()


def test_boxes_rows_and_columns_read_the_same_on_both_stores(target: StoreTarget) -> None:
    store = CentralStore(target)
    try:
        proof = store.register("box-2", "n2", "0.1", "http://198.51.100.2:1", "k2").secret
        assert store.register("box-1", "n1", "0.1", "http://198.51.100.1:1", "k1").moved
        again = store.register("box-2", "n2", "0.2", "http://198.51.100.2:1", "k2", proof)
        assert again.moved is False and again.secret is None
        store.seen("box-2", 41)
        (two, one) = store.boxes()  # in order of registration
        assert (two.box_id, two.version, two.counter, one.counter) == ("box-2", "0.2", 41, None)
        assert two.last_seen_at is not None and one.last_seen_at is None
        store.take_page("box-1", "children", "seq", [{"id": 1, "seq": 1, "artifact": "a"}], 1)
        store.take_page(
            "box-2",
            "children",
            "seq",
            [{"id": 1, "seq": 1, "artifact": "a"}, {"id": 2, "seq": 2, "artifact": "b", "pid": 7}],
            2,
        )
        rows = store.mirrored("children", None, 10, 0, True)
        assert [(r["box_id"], r["id"]) for r in rows] == [("box-2", 2), ("box-2", 1), ("box-1", 1)]
        assert store.mirrored("children", "box-1", 10, 1, False) == []
        assert store.table_columns() == {"children": ["box_id", "artifact", "id", "pid", "seq"]}
    finally:
        store.close()


def test_postgres_sql_is_sqlite_sql_with_two_words_changed() -> None:
    assert to_postgres("CREATE TABLE t (a INTEGER, b REAL, c BLOB, d TEXT)") == (
        "CREATE TABLE t (a BIGINT, b DOUBLE PRECISION, c BYTEA, d TEXT)"
    )
    assert to_postgres("SELECT a FROM t WHERE b = ? AND c LIKE '?%' AND d = '50%'") == (
        "SELECT a FROM t WHERE b = %s AND c LIKE '?%' AND d = '50%'"
    )
    assert to_postgres("SELECT INTEGER, a % 2 FROM t", placeholders=True) == (
        "SELECT INTEGER, a %% 2 FROM t"
    )  # only DDL's types change
    hidden = redact("postgresql://u:s3cret@db.example:5432/c")
    assert hidden == "postgresql://u:***@db.example:5432/c"
    assert redact("postgresql://u@db.example/c") == "postgresql://u@db.example/c"


def test_a_dropped_database_connection_is_opened_again(postgres: PostgresCluster) -> None:
    """The server ends the central's session (as a restart or a cut does): the next call
    works on a new connection, with nothing the earlier ones wrote lost."""
    import psycopg

    url = postgres.create_database()
    store = CentralStore(url)
    _, secret = store.run(lambda conn: create_key(conn, "t", ("admin",)))
    checker = store.key_checker()
    try:
        store.take_page("b", "call_log", "seq", [{"id": 1, "seq": 1}], 1)
        assert checker.verify(secret) is not None
        with psycopg.connect(postgres.url(), autocommit=True) as admin:
            database = url.rsplit("/", 1)[1]
            ended = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                "AND application_name = 'fitbox-central'",
                (database,),
            ).fetchall()
        assert ended == [(True,), (True,)]  # the store's and the key checker's
        assert checker.verify(secret) is not None  # the first key after it still counts
        assert store.cursor("b", "call_log") == 1
        store.take_page("b", "call_log", "seq", [{"id": 2, "seq": 2}], 2)
        assert [r["id"] for r in store.mirrored("call_log", "b", 10, 0, False)] == [1, 2]
    finally:
        checker.close()
        store.close()


def test_the_database_password_is_never_printed(
    postgres: PostgresCluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    wrong = postgres.url(password="Wrong-Secret-42")
    with pytest.raises(StoreUnavailable) as caught:
        CentralStore(wrong)
    assert (
        "Wrong-Secret-42" not in str(caught.value)
        and "password authentication" in str(caught.value)
        and f"fitbox:***@127.0.0.1:{postgres.port}" in str(caught.value)
    )
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    monkeypatch.setenv("FITBOX_CENTRAL_DB", wrong)
    code = fitbox_main(["central", "keys", "create", "--scope", "worker", "--home", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 1 and "cannot reach the central's store" in err and "Wrong-Secret-42" not in err
    monkeypatch.setenv("FITBOX_CENTRAL_DB", "mysql://u:Wrong-Secret-42@h/db")
    with pytest.raises(settings.ConfigError, match="FITBOX_CENTRAL_DB") as refused:
        settings.load({})
    assert "Wrong-Secret-42" not in str(refused.value)


def test_a_database_that_went_away_is_a_503_that_names_it(
    postgres: PostgresCluster,
    tmp_path: Path,
) -> None:
    """The database refuses the central (dropped connections, no new ones): a route that
    reads it answers 503 store_unavailable with the store named, and so does a keyed call:
    its key cannot be checked, which is not the same as a key that is not valid."""
    import psycopg

    url = postgres.create_database()
    database = url.rsplit("/", 1)[1]
    key = _key(url, "admin")
    config = settings.load({"home": str(tmp_path), "host": "0.0.0.0"}, env={})
    with (
        TestClient(
            create_central_app(config, url), client=("127.0.0.1", 40000), base_url=HOST
        ) as local,
        psycopg.connect(postgres.url(), autocommit=True) as admin,
    ):
        assert local.get("/v1/telemetry/rows", params={"table": "call_log"}).status_code == 200
        outside = {"Authorization": f"Bearer {key}"}
        remote = TestClient(local.app, client=OUTSIDE, base_url=HOST)  # the running app
        assert remote.get("/v1/fleet", headers=outside).status_code == 200
        admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
            "%s AND pid <> pg_backend_pid()",
            (database,),
        )
        error = _error(
            local.get("/v1/telemetry/rows", params={"table": "call_log"}), 503, "store_unavailable"
        )
        assert f"fitbox:***@127.0.0.1:{postgres.port}/{database}" in error["message"]
        assert postgres.password not in error["message"]
        keyed = _error(remote.get("/v1/fleet", headers=outside), 503, "store_unavailable")
        assert f"127.0.0.1:{postgres.port}/{database}" in keyed["message"]
        admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
        rows = local.get("/v1/telemetry/rows", params={"table": "call_log"})  # opened again
        assert rows.status_code == 200, rows.text


def test_a_stopped_database_is_a_503_naming_it_and_health_says_the_store_is_down(
    tmp_path: Path,
) -> None:
    """The central's PostgreSQL stopped (its own cluster: the shared one stays up): a keyed
    call is 503 store_unavailable naming the store, not 401 (the key was never checked),
    each time, and /health says the store is down and why."""
    cluster = PostgresCluster.start()
    try:
        url = cluster.create_database()
        key = {"Authorization": f"Bearer {_key(url, 'inference')}"}
        config = settings.load({"home": str(tmp_path), "host": "0.0.0.0"}, env={})
        with TestClient(create_central_app(config, url), client=OUTSIDE) as client:
            assert client.get("/v1/models", headers=key).status_code == 200
            health = client.get("/health").json()
            assert (health["status"], health["store"], health["problems"]) == ("ok", "up", [])
            cluster.stop()
            for _ in range(2):  # the first meets the dropped connection, the next the refusal
                error = _error(client.get("/v1/models", headers=key), 503, "store_unavailable")
                assert f"127.0.0.1:{cluster.port}/" in error["message"]
                assert cluster.password not in error["message"]
            health = client.get("/health").json()
            assert (health["status"], health["store"]) == ("degraded", "down")
            assert f"127.0.0.1:{cluster.port}/" in health["problems"][0]
    finally:
        cluster.stop()


def test_a_key_check_the_database_holds_holds_no_other_call(
    postgres: PostgresCluster,
    tmp_path: Path,
) -> None:
    """A key check waits on PostgreSQL (the test holds the keys' table locked): a call that
    needs no key is answered meanwhile by the same running central, and the key is admitted
    once the test lets the table go."""
    import psycopg

    url = postgres.create_database()
    key = _key(url, "admin")
    config = settings.load({"home": str(tmp_path), "host": "0.0.0.0"}, env={})
    with (
        TestClient(create_central_app(config, url), client=OUTSIDE, base_url=HOST) as client,
        psycopg.connect(url, autocommit=True) as locker,
        psycopg.connect(url, autocommit=True) as watcher,
    ):
        locker.execute("BEGIN")
        locker.execute("LOCK TABLE api_keys IN ACCESS EXCLUSIVE MODE")
        try:
            keyed = Background(
                lambda: client.get("/v1/fleet", headers={"Authorization": f"Bearer {key}"})
            )

            def key_check_waiting() -> bool:
                row = watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                    "'fitbox-central' AND wait_event_type = 'Lock'"
                ).fetchone()
                return bool(row and row[0] == 1)

            until(key_check_waiting, "the key check waiting on the locked table")
            keyless = Background(lambda: client.get("/health"))
            assert keyless.result().status_code == 200  # not held behind the key
            assert keyed.is_alive()  # the key check still waits on the database
        finally:
            locker.execute("COMMIT")
        answer = keyed.result()
        assert answer.status_code == 200, answer.text


def test_every_route_of_the_central_is_in_its_openapi(central: tuple[TestClient, Path]) -> None:
    from fitbox.central.app import ROUTES

    client, _ = central
    document = client.get("/openapi.json").json()  # open, like /health
    assert document["info"]["title"] == "fitbox central"
    served = {
        (r.path.replace(":path}", "}"), m.lower())  # OpenAPI writes no converters
        for r in ROUTES
        for m in (r.methods or ())
        if m != "HEAD"
    }
    documented = {(p, m) for p, ops in document["paths"].items() for m in ops}
    assert served == documented
    assert "Error" in document["components"]["schemas"]
    forwarded = document["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert "box_unavailable" in forwarded["503"]["description"]
    assert {"Retry-After", "x-should-retry"} <= set(forwarded["503"]["headers"])
    assert {"Retry-After", "x-should-retry"} <= set(forwarded["502"]["headers"])
    passed = forwarded["200"]["headers"]
    assert "spill" in passed["x-fitbox-route"]["schema"]["enum"]
    assert {"x-fitbox-box", "x-fitbox-spill", "Server-Timing"} <= set(passed)
    from fitbox.central.openapi import FORWARDED

    for endpoint in FORWARDED:  # every forwarded route, every method: the same words
        for op in document["paths"][endpoint.doc_path].values():
            assert "box_unavailable" in op["responses"]["503"]["description"]
            assert all(
                "x-fitbox-route" in answer.get("headers", {})
                for status, answer in op["responses"].items()
                if status.startswith("2")
            )


def test_limits_from_the_centre_say_why_they_cannot_be_set(tmp_path: Path) -> None:
    """An unknown box, a body that names the box's own tier, and a box that is down: each an
    OpenAI-shaped error with the reason (setting one through a real box: test_central_e2e)."""
    config = settings.load({"home": str(tmp_path), "host": "127.0.0.1"}, env={})
    store_path = tmp_path / "central.sqlite3"
    store = CentralStore(store_path)
    store.register(BOX["box_id"], "down", "0.1.0", "http://127.0.0.1:9", "fb_x")  # no one there
    store.close()
    with TestClient(
        create_central_app(config, store_path), client=("127.0.0.1", 5), base_url=HOST
    ) as client:
        path = f"/v1/fleet/boxes/{BOX['box_id']}/limits"
        error = _error(client.post("/v1/fleet/boxes/nobody/limits", json={}), 404, "box_not_found")
        assert "GET /v1/fleet" in error["message"]
        error = _error(
            client.post(path, json={"tier": "box", "ram_max": "1GiB"}), 400, "invalid_request"
        )
        assert error["param"] == "tier" and "central tier only" in error["message"]
        _error(client.post(path, json=["ram_max"]), 400, "invalid_request")
        error = _error(client.post(path, json={"ram_max": "1GiB"}), 502, "box_unreachable")
        assert "http://127.0.0.1:9" in error["message"]
        _error(client.get(path), 502, "box_unreachable")


def test_a_kept_connection_the_box_drops_unread_is_sent_again_on_a_fresh_one() -> None:
    """A box's keep-alive timer closes a kept connection as a request arrives on it (a box
    thawed after a pause): the box never read it, so the central sends it once more on a
    fresh connection and the call is answered, not lost (central/box_link.py)."""
    import asyncio

    from fitbox.central.box_link import BoxHttp, relayed

    requests_read: list[int] = []  # per connection, in the order they opened

    async def box(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        requests_read.append(0)
        mine, answered = len(requests_read) - 1, 0
        while await reader.readuntil(b"\r\n\r\n"):
            requests_read[mine] += 1
            if answered:  # the second request on a kept connection: closed unanswered
                break
            body = b'{"ok": true}'
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(body), body)
            )
            await writer.drain()
            answered += 1
        writer.close()

    async def calls() -> list[bytes]:
        server = await asyncio.start_server(box, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        http = BoxHttp(f"http://127.0.0.1:{port}")
        got = []
        try:
            for _ in range(2):
                response = await http.send("POST", "/v1/completions", b"{}", {}, 5.0)
                got.append(b"".join([piece async for piece in relayed(response, 5.0)]))
        finally:
            await http.close()
            server.close()
            await server.wait_closed()
        return got

    assert asyncio.run(calls()) == [b'{"ok": true}', b'{"ok": true}']
    # the kept connection carried both calls (the second dropped), the fresh one the second
    assert requests_read == [2, 1]


def test_speeds_are_offered_while_a_box_would_still_read_them() -> None:
    """Every call with timings writes a speed: the central offers the first of each (box,
    file, rung), as many as a box keeps of imported ones, and a box that comes up the newest
    that many, never every one (each would cost every other box a request and a write)."""
    from fitbox.box.speeds import SPEED_WINDOW
    from fitbox.central.facts import SPEEDS_OFFERED, SpeedQuota, newest_speeds

    assert SPEEDS_OFFERED == SPEED_WINDOW
    quota = SpeedQuota(most=2)
    rows = [{"artifact": "/m/a.gguf", "rung": "ram-only", "id": i} for i in range(3)]
    assert [r["id"] for r in quota.take("box-a", rows)] == [0, 1]
    assert quota.take("box-a", rows) == []  # its share is offered: none again
    assert [r["id"] for r in quota.take("box-b", rows[:1])] == [0]  # each box its own
    other = {"artifact": "/m/a.gguf", "rung": "gpu-only", "id": 9}
    assert quota.take("box-a", [other]) == [other]  # each rung its own
    later = {"artifact": "/m/a.gguf", "rung": "ram-only", "id": 5}
    assert [r["id"] for r in newest_speeds([*rows, other, later], most=2)] == [2, 9, 5]


def test_a_box_s_last_known_models_outlive_the_store_being_opened_again(
    target: StoreTarget,
) -> None:
    """What a restart of the central knows of a box's models before its first sync."""
    store = CentralStore(target)
    try:
        store.register("box-1", "n1", "0.1", "http://198.51.100.1:1", "k1")
        assert last_known_models(store.boxes()[0]) == []  # never synced: nothing known
        store.keep_models("box-1", [{"id": "smol", "resident": True}])
    finally:
        store.close()
    again = CentralStore(target)
    try:
        assert last_known_models(again.boxes()[0]) == [{"id": "smol", "resident": True}]
        assert "models" not in again.boxes()[0].public()
    finally:
        again.close()
