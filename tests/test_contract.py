"""The contract in process: /openapi.json declares what the box answers (a created key is a
201, every operator action is listed, settings bodies refuse unknown knobs as the server
does), a method a path does not answer is a 405 naming the methods it does, /mcp refuses in
OpenAI error bodies where its SDK wrote plain text, and the refusals schemathesis found the
server missing (tests/test_contract_e2e.py holds the whole surface to the document)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from fitbox import config, setting_api
from fitbox.server.manage.operate import ACTIONS
from fitbox.server.routes import PATHS

from .support.clients import app_client, assert_error


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    home = tmp_path_factory.mktemp("contract")
    (home / "models").mkdir()
    cfg = config.load(
        {"home": str(home), "models": str(home / "models"), "ram_max": "1MiB"}, env={}
    )
    with app_client(cfg, raise_server_exceptions=False) as client:
        yield client


def _operation(path: str, method: str) -> dict[str, Any]:
    found: dict[str, Any] = PATHS[path][method]
    return found


def test_a_created_key_is_declared_201_as_it_is_answered(client: TestClient) -> None:
    assert set(_operation("/v1/keys", "post")["responses"]) == {"201", "default"}
    assert client.post("/v1/keys", json={"name": "contract"}).status_code == 201


def test_every_operator_action_is_in_the_document() -> None:
    (action,) = _operation("/v1/operator/{action}", "post")["parameters"]
    assert action["schema"]["enum"] == list(ACTIONS)
    assert {"reap-to-fit", "copy-to-central"} <= set(action["schema"]["enum"])


def test_a_settings_body_is_as_strict_as_its_parser() -> None:
    box = _operation("/v1/settings/box", "post")["requestBody"]
    shape = box["content"]["application/json"]["schema"]
    assert shape["additionalProperties"] is False
    assert not box["required"]  # no body reads as {}
    assert shape["properties"]["goal"]["enum"][-1] is None  # null clears a knob
    assert shape["properties"]["window"]["type"] == "integer"
    chat = _operation("/v1/chat/completions", "post")["requestBody"]["content"]
    assert chat["application/json"]["schema"]["properties"]["model"]["minLength"] == 1


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("DELETE", "/v1/keys", {"GET", "HEAD", "POST"}),  # a path split over two entries
        ("PUT", "/v1/chat/completions", {"POST"}),
        ("POST", "/v1/keys/abc", {"GET", "HEAD", "DELETE"}),
        ("GET", "/mcp", {"POST"}),  # stateless: no server events; was a stream sending nothing
        ("DELETE", "/mcp", {"POST"}),  # no session to end
    ],
)
def test_a_method_the_path_does_not_answer_is_405_with_allow(
    client: TestClient, method: str, path: str, allowed: set[str]
) -> None:
    response = client.request(method, path)
    error = assert_error(response, 405, "method_not_allowed")
    assert {m.strip() for m in response.headers["allow"].split(",")} == allowed
    assert path in str(error["message"])


def test_mcp_refusals_are_openai_bodies_and_json_rpc_stays(client: TestClient) -> None:
    plain = client.post("/mcp", content=b"{}", headers={"content-type": "text/plain"})
    assert_error(plain, 400, "invalid_request")
    assert "Content-Type" in plain.json()["error"]["message"]
    large = client.post(
        "/mcp",
        content=b" " * (5 << 20),
        headers={"content-type": "application/json", "accept": "application/json"},
    )
    assert_error(large, 413, "request_too_large")
    rpc = client.post(
        "/mcp",
        content=b"x",
        headers={"content-type": "application/json", "accept": "application/json"},
    )
    assert rpc.status_code == 400 and rpc.json()["jsonrpc"] == "2.0"  # the protocol's own


def test_a_kv_types_item_that_is_no_string_is_a_named_refusal(client: TestClient) -> None:
    """Found by schemathesis: ``[{}]`` was a 500 (a dict looked up in the K/V table)."""
    with pytest.raises(ValueError, match="cache types"):
        setting_api.kv([{}])
    response = client.post("/v1/settings/box", json={"kv_types": [{}]})
    assert_error(response, 400, "invalid_request")


def test_true_is_no_key_lifetime(client: TestClient) -> None:
    """Found by schemathesis: ``true`` passed for one second (a bool is an int)."""
    response = client.post("/v1/keys", json={"expires_in_s": True})
    assert_error(response, 400, "invalid_request")


def test_a_cursor_past_the_bound_is_refused_exactly(client: TestClient) -> None:
    """Found by schemathesis: 2**62 + 1 read as a float is 2**62, and passed."""
    assert client.get("/v1/telemetry/state", params={"since": 2**62}).status_code == 200
    response = client.get("/v1/telemetry/state", params={"since": 2**62 + 1})
    assert_error(response, 400, "invalid_request")


def test_an_operator_body_that_is_no_object_is_refused_for_every_action(
    client: TestClient,
) -> None:
    """Found by schemathesis: refresh-models never read its body, so ``[1]`` passed."""
    response = client.post("/v1/operator/refresh-models", content=b"[1]")
    assert_error(response, 400, "invalid_request")
    assert client.post("/v1/operator/refresh-models").status_code == 200
