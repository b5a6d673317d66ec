"""The HTTP surface in-process: error bodies, /health, /v1/models. No engine is launched."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

import fitbox
from fitbox import config
from fitbox.server.app import create_app

from .support.clients import app_client, assert_error, call_rows
from .support.ggufs import write_tiny_llama
from .support.paths import BOX


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    models = tmp_path / "models"
    models.mkdir()
    write_tiny_llama(models / "tiny.gguf")
    cfg = config.load(
        {"home": str(tmp_path / "home"), "models": str(models), "ram_max": "1MiB"},
        env={"FITBOX_SIMULATED_GPUS": ""},
    )
    with app_client(cfg) as test_client:
        yield test_client


def test_health(client: TestClient) -> None:
    body = client.get("/health").json()
    assert body["status"] == "ok" and body["service"] == "fitbox"
    assert body["version"] == fitbox.__version__


def test_models_lists_the_catalog(client: TestClient) -> None:
    data = client.get("/v1/models").json()["data"]
    assert [m["id"] for m in data] == ["tiny", "fitbox-helper"]  # the helper: always, last
    assert data[0]["resident"] is False and data[0]["object"] == "model"


def test_malformed_json_is_a_400(client: TestClient) -> None:
    response = client.post(
        "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    error = assert_error(response, 400, "invalid_request")
    assert error["type"] == "invalid_request_error"
    assert "not valid JSON" in str(error["message"])


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": []}, "model"),
        ({"model": "tiny"}, "messages"),
        ({"model": 3, "messages": []}, "model"),
        ({"model": "", "messages": []}, "model"),
    ],
)
def test_missing_or_wrong_fields_name_the_param(
    client: TestClient, body: dict[str, object], param: str
) -> None:
    error = assert_error(client.post("/v1/chat/completions", json=body), 400, "invalid_request")
    assert error["param"] == param


def test_a_json_array_is_not_a_request(client: TestClient) -> None:
    assert_error(client.post("/v1/completions", json=[1, 2]), 400, "invalid_request")


def test_unknown_model_is_404_model_not_found(client: TestClient) -> None:
    response = client.post(
        "/v1/chat/completions",
        json={"model": "nope", "messages": [{"role": "user", "content": "x"}]},
    )
    error = assert_error(response, 404, "model_not_found")
    assert "tiny" in str(error["message"])  # says what does exist


def test_too_big_for_the_budget_is_refused_with_the_numbers(client: TestClient) -> None:
    response = client.post(
        "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "x"}]},
    )
    error = assert_error(response, 507, "does_not_fit")
    assert int(str(error["needed_bytes"])) > int(str(error["available_bytes"])) == 1 << 20
    assert response.headers["x-should-retry"] == "false"


def test_unknown_route_and_method_are_openai_errors(client: TestClient) -> None:
    assert_error(client.get("/v1/nothing"), 404, "not_found")
    assert_error(client.get("/v1/chat/completions"), 405, "method_not_allowed")


def test_an_unexpected_error_is_an_openai_500_that_closes_the_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fitbox.store import keys

    def broken(conn: object) -> list[object]:
        raise RuntimeError("a bug")

    monkeypatch.setattr(keys, "list_keys", broken)
    cfg = config.load({"home": str(tmp_path / "home"), "models": str(tmp_path)}, env={})
    app = create_app(cfg)
    with TestClient(
        app, base_url=BOX, client=("127.0.0.1", 1), raise_server_exceptions=False
    ) as client:
        response = client.get("/v1/keys")
    error = assert_error(response, 500, "internal_error")
    assert "RuntimeError" in str(error["message"])
    # uvicorn closes the connection after an unhandled exception: the client must be told
    assert response.headers["connection"] == "close"


def test_an_error_quoting_a_lone_surrogate_still_renders() -> None:
    from fitbox.errors import InvalidRequest
    from fitbox.server.door.errors import error_response

    response = error_response(InvalidRequest("no model '\ud800'"))
    assert json.loads(bytes(response.body))["error"]["message"] == "no model '\ud800'"


@pytest.mark.parametrize(
    ("path", "content", "model", "stream"),
    [
        ("/v1/chat/completions", b"{not json", "", 0),
        ("/v1/chat/completions", b'{"model": "tiny", "stream": true}', "tiny", 1),
        ("/v1/completions", b'{"model": "tiny", "prompt": 3}', "tiny", 0),
        ("/v1/embeddings", b'{"model": "\\ud800", "input": "x"}', "", 0),
    ],
    ids=["malformed", "no-messages", "wrong-prompt", "lone-surrogate"],
)
def test_a_call_refused_by_validation_leaves_a_row(
    client: TestClient, path: str, content: bytes, model: str, stream: int
) -> None:
    assert_error(client.post(path, content=content), 400, "invalid_request")
    (row,) = call_rows(client)
    assert (row["endpoint"], row["model_asked"], row["stream"]) == (path, model, stream)
    assert (row["outcome"], row["http_status"], row["error_code"]) == (
        "error",
        400,
        "invalid_request",
    )


def test_management_bodies_refused_leave_no_call_row(client: TestClient) -> None:
    assert_error(client.post("/v1/keys", content=b"{not json"), 400, "invalid_request")
    assert call_rows(client) == []
