"""The central's door and parts without an engine: who may register, the reasons a
registration is refused, what a worker key cannot do, the errors of its routes, and which
rows the mirror keeps raw. The central app runs in process (no box is needed to refuse)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from fitbox import config as settings
from fitbox.central.app import create_central_app
from fitbox.central.cli import CENTRAL_SCOPES
from fitbox.central.store import CentralStore, rejection
from fitbox.server.joining import Registration
from fitbox.store.keys import create_key

OUTSIDE = ("203.0.113.9", 50000)  # a documentation address: never the central itself
BOX = {"box_id": "0b7c1d2e-0000-4000-8000-000000000001", "name": "gpu-1", "version": "0.1.0",
       "url": "http://198.51.100.7:8484", "admin_key": "fb_000000000000_" + "x" * 43}  # fmt: skip


def _key(store_path: Path, *scopes: str) -> str:
    store = CentralStore(store_path)
    try:
        _, secret = store.run(lambda conn: create_key(conn, "t", scopes, known=CENTRAL_SCOPES))
    finally:
        store.close()
    return str(secret)


@pytest.fixture
def central(tmp_path: Path) -> Iterator[tuple[TestClient, Path]]:
    """A central listening on every address, called from outside it."""
    config = settings.load({"home": str(tmp_path), "host": "0.0.0.0"}, env={})
    store_path = tmp_path / "central.sqlite3"
    CentralStore(store_path).close()
    with TestClient(create_central_app(config, store_path), client=OUTSIDE) as client:
        yield client, store_path


def _error(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == code and error["message"] and "type" in error and "param" in error
    return error


def test_registering_from_outside_needs_the_worker_key(central: tuple[TestClient, Path]) -> None:
    client, _ = central
    error = _error(client.post("/v1/boxes", json=BOX), 401, "missing_api_key")
    assert "--central-key" in error["message"]
    bad = {"Authorization": "Bearer fb_000000000000_" + "y" * 43}
    _error(client.post("/v1/boxes", json=BOX, headers=bad), 401, "invalid_api_key")


def test_an_inference_key_cannot_register(central: tuple[TestClient, Path]) -> None:
    client, store_path = central
    key = _key(store_path, "inference")
    error = _error(client.post("/v1/boxes", json=BOX, headers={"Authorization": f"Bearer {key}"}),
                   403, "insufficient_scope")  # fmt: skip
    assert "worker" in error["message"]


def test_a_worker_key_registers_and_can_do_nothing_else(
    central: tuple[TestClient, Path],
) -> None:
    client, store_path = central
    auth = {"Authorization": f"Bearer {_key(store_path, 'worker')}"}
    taken = client.post("/v1/boxes", json=BOX, headers=auth)
    assert taken.status_code == 201 and taken.json() == {
        "box_id": BOX["box_id"],
        "registered": True,
        "moved": True,
    }
    again = client.post("/v1/boxes", json=BOX, headers=auth)  # same address: not moved
    assert again.status_code == 200 and again.json()["moved"] is False
    moved = client.post("/v1/boxes", json={**BOX, "url": "http://198.51.100.7:9000"}, headers=auth)
    assert moved.status_code == 201 and moved.json()["moved"] is True
    for path in ("/v1/fleet", "/v1/telemetry/tables", "/v1/models"):
        _error(client.get(path, headers=auth), 403, "insufficient_scope")
    admin = {"Authorization": f"Bearer {_key(store_path, 'admin')}"}
    fleet = client.get("/v1/fleet", headers=admin).json()["data"]
    assert [b["url"] for b in fleet] == ["http://198.51.100.7:9000"]  # one box, moved
    assert "admin_key" not in fleet[0]


def test_a_loopback_box_is_refused_by_a_central_elsewhere(
    central: tuple[TestClient, Path],
) -> None:
    client, store_path = central
    auth = {"Authorization": f"Bearer {_key(store_path, 'worker')}"}
    loopback = {**BOX, "url": "http://127.0.0.1:8484"}
    error = _error(client.post("/v1/boxes", json=loopback, headers=auth), 400, "box_unreachable")
    assert "--host 0.0.0.0" in error["message"] and error["param"] == "url"
    error = _error(client.post("/v1/boxes", json={**BOX, "url": ""}, headers=auth), 400,
                   "invalid_request")  # fmt: skip
    assert error["param"] == "url"


def test_the_box_sees_a_loopback_problem_before_asking() -> None:
    reg = Registration("http://198.51.100.1:8484", "k", "id", "n", "http://127.0.0.1:1", "b")
    assert "loopback only" in (reg.loopback_problem() or "")
    same_host = Registration("http://127.0.0.1:9", "k", "id", "n", "http://127.0.0.1:1", "b")
    assert same_host.loopback_problem() is None


def test_the_routes_errors_are_openai_shaped(central: tuple[TestClient, Path]) -> None:
    client, store_path = central
    auth = {"Authorization": f"Bearer {_key(store_path, 'admin')}"}
    error = _error(client.post("/v1/chat/completions", json={"model": "nothing", "messages": []},
                               headers=auth), 404, "model_not_found")  # fmt: skip
    assert "GET /v1/models" in error["message"]
    _error(client.post("/v1/chat/completions", json={"messages": []}, headers=auth), 400,
           "invalid_request")  # fmt: skip
    _error(client.post("/v1/embeddings", content=b"{", headers=auth), 400, "invalid_request")
    error = _error(client.get("/v1/telemetry/rows", params={"table": "api_keys"}, headers=auth),
                   400, "invalid_request")  # fmt: skip
    assert error["param"] == "table"
    _error(client.get("/v1/telemetry/rows", params={"table": "call_log", "limit": "x"},
                      headers=auth), 400, "invalid_request")  # fmt: skip


@pytest.mark.parametrize(("row", "reason"), [
    ({"id": 1, "seq": 2, "prompt_tokens": "many"}, "prompt_tokens"),
    ({"id": "1", "seq": 2}, "'id'"),
    ({"id": 1}, "'seq'"),
    ({"id": 1, "seq": 2, "devices": [0]}, "devices"),
    (["not", "a", "row"], "JSON object"),
])  # fmt: skip
def test_rows_the_mirror_cannot_take_say_why(row: Any, reason: str) -> None:
    assert reason in (rejection(row, "seq") or "")


def test_a_row_the_mirror_can_take() -> None:
    assert rejection({"id": 1, "seq": 2, "prompt_tokens": 5, "outcome": "ok",
                      "received_at": 1.5, "evicted": None}, "seq") is None  # fmt: skip


def test_a_page_lands_once_and_a_changed_row_replaces_itself(tmp_path: Path) -> None:
    store = CentralStore(tmp_path / "c.sqlite3")
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


def test_every_route_of_the_central_is_in_its_openapi(central: tuple[TestClient, Path]) -> None:
    from fitbox.central.app import ROUTES

    client, _ = central
    document = client.get("/openapi.json").json()  # open, like /health
    assert document["info"]["title"] == "fitbox central"
    served = {(r.path, m.lower()) for r in ROUTES for m in (r.methods or ()) if m != "HEAD"}
    documented = {(p, m) for p, ops in document["paths"].items() for m in ops}
    assert served == documented
    assert "Error" in document["components"]["schemas"]


def test_limits_from_the_centre_say_why_they_cannot_be_set(tmp_path: Path) -> None:
    """An unknown box, a body that names the box's own tier, and a box that is down: each an
    OpenAI-shaped error with the reason (setting one through a real box: test_central_e2e)."""
    config = settings.load({"home": str(tmp_path), "host": "127.0.0.1"}, env={})
    store_path = tmp_path / "central.sqlite3"
    store = CentralStore(store_path)
    store.register(BOX["box_id"], "down", "0.1.0", "http://127.0.0.1:9", "fb_x")  # no one there
    store.close()
    with TestClient(create_central_app(config, store_path), client=("127.0.0.1", 5)) as client:
        path = f"/v1/fleet/boxes/{BOX['box_id']}/limits"
        error = _error(client.post("/v1/fleet/boxes/nobody/limits", json={}), 404,
                       "box_not_found")  # fmt: skip
        assert "GET /v1/fleet" in error["message"]
        error = _error(client.post(path, json={"tier": "box", "ram_max": "1GiB"}), 400,
                       "invalid_request")  # fmt: skip
        assert error["param"] == "tier" and "central tier only" in error["message"]
        _error(client.post(path, json=["ram_max"]), 400, "invalid_request")
        error = _error(client.post(path, json={"ram_max": "1GiB"}), 502, "box_unreachable")
        assert "http://127.0.0.1:9" in error["message"]
        _error(client.get(path), 502, "box_unreachable")
