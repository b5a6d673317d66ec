"""The box key is the box's root: no admin key revokes it alone; rotation mints the new one,
writes the key file and retires the old one, also while the box runs (in-process)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from fitbox import cli, config
from fitbox.store.keys import create_key

from .support.clients import app_client, assert_error

OUTSIDE = ("203.0.113.5", 5000)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "models").mkdir()
    return tmp_path


def _client(home: Path, peer: tuple[str, int] = OUTSIDE) -> TestClient:
    cfg = config.load({"home": str(home), "models": str(home / "models")}, env={})
    return app_client(cfg, peer)


@pytest.fixture
def box(home: Path) -> Iterator[TestClient]:
    with _client(home) as running:  # the first start writes the box key
        yield running


def _admin(home: Path) -> dict[str, str]:
    with sqlite3.connect(home / "fitbox.sqlite3") as conn:
        secret = create_key(conn, "ops", ("admin",))[1]
    return {"Authorization": f"Bearer {secret}"}


def _bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def test_an_admin_key_cannot_revoke_the_box_key(box: TestClient, home: Path) -> None:
    box_key = (home / "box.key").read_text().strip()
    box_id = box_key.split("_")[1]
    refused = box.delete(f"/v1/keys/{box_id}", headers=_admin(home))
    error = assert_error(refused, 409, "box_key_held")
    assert error["param"] == "key_id" and "fitbox keys rotate-box" in str(error["message"])
    assert box.get("/v1/keys", headers=_bearer(box_key)).status_code == 200  # still works
    offline = cli.main(["keys", "revoke", box_id, "--home", str(home)])
    assert offline == 1  # the command line refuses it too


def test_rotating_the_box_key_while_the_box_runs(
    box: TestClient, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = (home / "box.key").read_text().strip()
    assert cli.main(["keys", "rotate-box", "--home", str(home)]) == 0
    new = (home / "box.key").read_text().strip()
    assert new != old and old.split("_")[1] in capsys.readouterr().out
    assert box.get("/v1/keys", headers=_bearer(new)).status_code == 200
    assert_error(box.get("/v1/keys", headers=_bearer(old)), 401, "invalid_api_key")
    listed = box.get("/v1/keys", headers=_bearer(new)).json()["data"]
    live = [k["id"] for k in listed if k["box_key"] and k["revoked_at"] is None]
    assert live == [new.split("_")[1]]
    with _client(home):  # a restart keeps the rotated key
        pass
    assert (home / "box.key").read_text().strip() == new
