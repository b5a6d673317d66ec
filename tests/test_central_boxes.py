"""A person's say over the central's boxes and keys, in process, on both stores (a SQLite
file and a PostgreSQL database): a box named, drained and removed through
/v1/fleet/boxes/{id} (a removed box joins again as new); keys listed and revoked with
`fitbox central keys`, a revoked key refused from the next request."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from fitbox import config as settings
from fitbox.central.app import create_central_app
from fitbox.central.backend import StoreTarget
from fitbox.central.store import CentralStore
from fitbox.cli import main as fitbox_main
from fitbox.cli.central import CENTRAL_SCOPES
from fitbox.store.keys import create_key

from .support.postgres import PostgresCluster

OUTSIDE = ("203.0.113.9", 50000)
BOX = {
    "box_id": "0b7c1d2e-0000-4000-8000-000000000002",
    "name": "gpu-2",
    "version": "0.1.0",
    "url": "http://198.51.100.8:8484",
    "admin_key": "fb_000000000000_" + "x" * 43,
}


@pytest.fixture(params=["sqlite", "postgres"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> StoreTarget:
    if request.param == "sqlite":
        return tmp_path / "central.sqlite3"
    cluster: PostgresCluster = request.getfixturevalue("postgres")
    return cluster.create_database()


def _key(target: StoreTarget, *scopes: str) -> tuple[str, str]:
    store = CentralStore(target)
    try:
        key, secret = store.run(lambda conn: create_key(conn, "t", scopes, known=CENTRAL_SCOPES))
    finally:
        store.close()
    return key.key_id, str(secret)


@pytest.fixture
def central(tmp_path: Path, target: StoreTarget) -> Iterator[tuple[TestClient, StoreTarget]]:
    config = settings.load({"home": str(tmp_path), "host": "0.0.0.0"}, env={})
    CentralStore(target).close()
    with TestClient(create_central_app(config, target), client=OUTSIDE) as client:
        yield client, target


def _error(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == code and error["message"]
    return error


def test_a_box_is_named_drained_and_removed_and_joins_again_as_new(
    central: tuple[TestClient, StoreTarget],
) -> None:
    client, target = central
    worker = {"Authorization": f"Bearer {_key(target, 'worker')[1]}"}
    admin = {"Authorization": f"Bearer {_key(target, 'admin')[1]}"}
    first = client.post("/v1/boxes", json=BOX, headers=worker).json()["box_secret"]
    path = f"/v1/fleet/boxes/{BOX['box_id']}"
    named = client.patch(path, json={"name": "rack-3"}, headers=admin).json()
    assert (named["name"], named["host_name"], named["draining"]) == ("rack-3", "gpu-2", False)
    drained = client.patch("/v1/fleet/boxes/rack-3", json={"draining": True}, headers=admin)
    assert drained.status_code == 200 and drained.json()["draining"] is True
    # a registration (the box's next start) keeps what a person set
    mine = {**BOX, "box_secret": first}
    assert client.post("/v1/boxes", json=mine, headers=worker).status_code == 200
    (listed,) = client.get("/v1/fleet", headers=admin).json()["data"]
    assert (listed["name"], listed["draining"]) == ("rack-3", True)
    back = client.patch(path, json={"name": None, "draining": False}, headers=admin).json()
    assert (back["name"], back["draining"]) == ("gpu-2", False)
    for bad in ({}, {"name": ""}, {"draining": "yes"}, {"url": "x"}, ["name"]):
        _error(client.patch(path, json=bad, headers=admin), 400, "invalid_request")
    _error(client.patch(path, json={"name": "x"}, headers=worker), 403, "insufficient_scope")
    _error(client.delete("/v1/fleet/boxes/nobody", headers=admin), 404, "box_not_found")
    removed = client.delete(path, headers=admin)
    assert removed.json() == {"box_id": BOX["box_id"], "removed": True}
    assert client.get("/v1/fleet", headers=admin).json()["data"] == []
    # removed: its id is new again, so a box that lost its secret joins (and gets another)
    again = client.post("/v1/boxes", json=BOX, headers=worker)
    assert again.status_code == 201 and again.json()["box_secret"] != first


def _cli_home(target: StoreTarget, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``fitbox central keys`` pointed at the test's store: its home, or its database."""
    if isinstance(target, str):
        monkeypatch.setenv("FITBOX_CENTRAL_DB", target)
    else:
        monkeypatch.delenv("FITBOX_CENTRAL_DB", raising=False)
    return ["--home", str(target.parent if isinstance(target, Path) else tmp_path)]


def test_central_keys_are_listed_and_a_revoked_one_is_refused_at_once(
    central: tuple[TestClient, StoreTarget],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    client, target = central
    home = _cli_home(target, tmp_path, monkeypatch)
    key_id, secret = _key(target, "admin")
    admin = {"Authorization": f"Bearer {secret}"}
    assert client.get("/v1/fleet", headers=admin).status_code == 200
    assert fitbox_main(["central", "keys", "list", *home]) == 0
    assert f"{key_id}  active  admin" in capsys.readouterr().out
    assert fitbox_main(["central", "keys", "revoke", key_id, *home]) == 0
    assert f"{key_id}  revoked" in capsys.readouterr().out
    _error(client.get("/v1/fleet", headers=admin), 401, "invalid_api_key")
    assert fitbox_main(["central", "keys", "revoke", "nope", *home]) == 1
    assert "no key with id 'nope'" in capsys.readouterr().err
    made = ["central", "keys", "create", "--scope", "worker", "--expires-in", "2h", *home]
    assert fitbox_main(made) == 0
    assert fitbox_main(["central", "keys", "create", "--expires-in", "soon", *home]) == 1
    assert "not a duration" in capsys.readouterr().err


def test_a_central_key_limited_to_a_model_asks_for_that_model_only(
    central: tuple[TestClient, StoreTarget],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    client, target = central
    home = _cli_home(target, tmp_path, monkeypatch)
    made = ["central", "keys", "create", "--model", "smol", "--model", "tiny", *home]
    assert fitbox_main(made) == 0
    limited = {"Authorization": f"Bearer {capsys.readouterr().out.strip()}"}
    assert fitbox_main(["central", "keys", "list", *home]) == 0
    assert "models smol,tiny" in capsys.readouterr().out
    asked = {"messages": [{"role": "user", "content": "hi"}]}
    error = _error(
        client.post("/v1/chat/completions", json={**asked, "model": "big"}, headers=limited),
        403,
        "model_not_allowed",
    )
    assert "smol, tiny" in error["message"] and error["param"] == "model"
    # an allowed name passes the key, and meets the fleet (no box has it here)
    allowed = client.post("/v1/chat/completions", json={**asked, "model": "smol"}, headers=limited)
    _error(allowed, 404, "model_not_found")
    assert client.get("/v1/models", headers=limited).status_code == 200
