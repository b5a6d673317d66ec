"""The central's SQLite store that cannot be read while the central runs (its file damaged,
deleted, or another put in its place): a keyed call is 503 store_unavailable naming the
file, not 401 (the key was never read, so it was not found wrong), and /health says the
store is down and why. In process, on a real file. (A lock is not among them: in WAL mode a
reader waits on no writer, and while the central holds the file open no other connection
can take it whole; chmod 000 does not stop root, who runs these tests: a file that cannot be
opened is the same sqlite3 error path as a damaged one.)"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from fitbox import config as settings
from fitbox.central.app import create_central_app
from fitbox.central.store import CentralStore
from fitbox.cli.central import CENTRAL_SCOPES
from fitbox.store.keys import create_key

OUTSIDE = ("203.0.113.9", 50000)


@pytest.fixture
def central(tmp_path: Path) -> Iterator[tuple[TestClient, Path, dict[str, str]]]:
    path = tmp_path / "central.sqlite3"
    store = CentralStore(path)
    try:
        _, secret = store.run(lambda conn: create_key(conn, "t", ("admin",), known=CENTRAL_SCOPES))
    finally:
        store.close()
    config = settings.load({"home": str(tmp_path), "host": "0.0.0.0"}, env={})
    with TestClient(create_central_app(config, path), client=OUTSIDE) as client:
        key = {"Authorization": f"Bearer {secret}"}
        assert client.get("/v1/fleet", headers=key).status_code == 200
        assert client.get("/health").json()["store"] == "up"
        yield client, path, key


def _down(client: TestClient, path: Path, key: dict[str, str], why: str) -> dict[str, Any]:
    answer = client.get("/v1/fleet", headers=key)
    assert answer.status_code == 503, answer.text
    error: dict[str, Any] = answer.json()["error"]
    assert error["code"] == "store_unavailable" and str(path) in error["message"]
    assert why in error["message"]
    assert answer.headers["x-should-retry"] == "true"
    health = client.get("/health").json()
    assert (health["status"], health["store"]) == ("degraded", "down")
    assert str(path) in health["problems"][0]
    return error


def test_a_damaged_store_file_is_a_503_naming_it(
    central: tuple[TestClient, Path, dict[str, str]],
) -> None:
    client, path, key = central
    with path.open("r+b") as damaged:
        damaged.write(b"not a database " * 100)
    _down(client, path, key, "not a database")


def test_a_deleted_store_file_is_a_503_naming_it(
    central: tuple[TestClient, Path, dict[str, str]],
) -> None:
    client, path, key = central
    path.rename(path.with_name("elsewhere.sqlite3"))
    _down(client, path, key, "is gone")
    path.with_name("elsewhere.sqlite3").rename(path)  # back: the same file answers again
    assert client.get("/v1/fleet", headers=key).status_code == 200
    assert client.get("/health").json()["store"] == "up"


def test_a_store_file_put_in_its_place_is_a_503_naming_it(
    central: tuple[TestClient, Path, dict[str, str]], tmp_path: Path
) -> None:
    """Another file at its path (a restore while it ran): its keys are not the ones the
    central writes beside, so none is read from it."""
    client, path, key = central
    other = tmp_path / "other.sqlite3"
    CentralStore(other).close()
    os.replace(other, path)
    _down(client, path, key, "another file")
