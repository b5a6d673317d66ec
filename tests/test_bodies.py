"""The one body parser (server/door/bodies.py) in-process: a bounded body, and every malformed
body a 4xx with an OpenAI error body. No engine is launched."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from starlette.types import Message, Scope

from fitbox import config
from fitbox.server.app import create_app

from .support.clients import assert_error, call_rows
from .support.ggufs import write_tiny_llama
from .support.paths import BOX

LIMIT = 64 << 10  # FITBOX_MAX_BODY in these tests
CHAT = "/v1/chat/completions"


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    models = tmp_path / "models"
    models.mkdir()
    write_tiny_llama(models / "tiny.gguf")
    cfg = config.load(
        {"home": str(tmp_path / "home"), "models": str(models), "ram_max": "1MiB"},
        env={"FITBOX_MAX_BODY": str(LIMIT)},
    )
    with TestClient(
        create_app(cfg), base_url=BOX, client=("127.0.0.1", 50000), raise_server_exceptions=False
    ) as test_client:
        yield test_client


def drive(
    client: TestClient, headers: dict[str, str], chunks: list[bytes]
) -> tuple[int, dict[str, str], int]:
    """POST ``chunks`` to the chat route straight through ASGI. Returns the status, the
    response headers and how many of the chunks the app pulled before it answered."""
    pulled = 0
    sent: list[Message] = []

    async def receive() -> Message:
        nonlocal pulled
        if pulled == len(chunks):
            return {"type": "http.disconnect"}
        pulled += 1
        return {
            "type": "http.request",
            "body": chunks[pulled - 1],
            "more_body": pulled < len(chunks),
        }

    async def send(message: Message) -> None:
        sent.append(message)

    scope: Scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": CHAT,
        "raw_path": CHAT.encode(),
        "query_string": b"",
        "root_path": "",
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
    }
    assert client.portal is not None
    client.portal.call(client.app, scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    got = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], got, pulled


# -- the limit -------------------------------------------------------------------------------


def test_a_declared_body_over_the_limit_is_refused_before_a_byte_is_read(
    client: TestClient,
) -> None:
    chunks = [b"x" * (16 << 10)] * 40
    status, headers, pulled = drive(client, {"content-length": str(10 << 20)}, chunks)
    assert (status, pulled) == (413, 0)
    assert headers["connection"] == "close"  # the unread rest cannot be the next request


def test_a_chunked_body_is_refused_once_it_passes_the_limit(client: TestClient) -> None:
    chunks = [b"x" * (16 << 10)] * 40
    status, headers, pulled = drive(client, {"transfer-encoding": "chunked"}, chunks)
    assert (status, pulled) == (413, 5)  # 16, 32, 48, 64, 80 KiB > 64 KiB: the rest unread
    assert headers["connection"] == "close"


def test_an_oversized_body_is_an_openai_413_that_names_the_setting(client: TestClient) -> None:
    response = client.post(CHAT, content=b" " * (LIMIT + 1))
    error = assert_error(response, 413, "request_too_large")
    assert error["type"] == "invalid_request_error"
    assert "FITBOX_MAX_BODY" in str(error["message"]) and "64.00 KiB" in str(error["message"])


def test_a_body_at_the_limit_is_read(client: TestClient) -> None:
    body = b'{"model": "nope", "messages": []}'
    response = client.post(CHAT, content=body + b" " * (LIMIT - len(body)))
    assert_error(response, 404, "model_not_found")


def test_the_limit_is_a_setting_with_a_default() -> None:
    assert config.load({}, env={}).max_body == 32 << 20
    assert config.load({}, env={"FITBOX_MAX_BODY": "64MiB"}).max_body == 64 << 20
    with pytest.raises(config.ConfigError, match="FITBOX_MAX_BODY"):
        config.load({}, env={"FITBOX_MAX_BODY": "0"})


# -- what json.loads takes and nothing after it can use ------------------------------------


@pytest.mark.parametrize("number", [b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e999"])
def test_a_non_finite_number_is_a_400(client: TestClient, number: bytes) -> None:
    body = b'{"model": "tiny", "messages": [], "temperature": ' + number + b"}"
    error = assert_error(client.post(CHAT, content=body), 400, "invalid_request")
    assert "finite" in str(error["message"])


def test_a_key_that_expires_at_infinity_is_refused_and_listing_keeps_working(
    client: TestClient,
) -> None:
    refused = client.post("/v1/keys", content=b'{"name": "k", "expires_in_s": Infinity}')
    assert_error(refused, 400, "invalid_request")
    listed = client.get("/v1/keys")
    assert listed.status_code == 200 and all(k["box_key"] for k in listed.json()["data"])


@pytest.mark.parametrize(
    "body",
    [b"[" * 5000 + b"]" * 5000, b'{"a": ' * 5000 + b"1" + b"}" * 5000],
    ids=["arrays", "objects"],
)
def test_json_nested_five_thousand_levels_is_a_400(client: TestClient, body: bytes) -> None:
    error = assert_error(client.post(CHAT, content=body), 400, "invalid_request")
    assert "nested too deeply" in str(error["message"])


@pytest.mark.parametrize("depth", [65, 200, 900])
def test_a_body_nested_past_the_limit_is_a_400_however_deep_the_stack(
    client: TestClient, depth: int
) -> None:
    """Past 64 levels a body is refused by fitbox's own rule, not by where Python's parser
    happens to run out of stack: a 200-deep object sent to /v1/keys created a key."""
    body = b'{"a": ' * depth + b"1" + b"}" * depth
    error = assert_error(client.post("/v1/keys", content=body), 400, "invalid_request")
    assert "more than 64 levels" in str(error["message"])
    listed = client.get("/v1/keys").json()["data"]
    assert all(k["box_key"] for k in listed)  # no key was made of it


def test_a_body_sixty_four_levels_deep_is_read(client: TestClient) -> None:
    body = b'{"name": "deep", "x": ' + b"[" * 63 + b"]" * 63 + b"}"
    assert client.post("/v1/keys", content=body).status_code == 201


def test_an_integer_past_the_digit_limit_is_a_400(client: TestClient) -> None:
    body = b'{"model": "tiny", "messages": [], "seed": ' + b"7" * 5000 + b"}"
    assert_error(client.post(CHAT, content=body), 400, "invalid_request")


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "\\ud800", "messages": []}',
        b'{"model": "tiny", "messages": [{"role": "user", "content": "a\\udfffb"}]}',
        b'{"model": "tiny", "messages": [], "\\udc00": 1}',
        b'{"model": "\xed\xa0\x80", "messages": []}',  # the surrogate encoded, not escaped
    ],
    ids=["model", "content", "key", "encoded"],
)
def test_a_lone_surrogate_is_a_400(client: TestClient, body: bytes) -> None:
    assert_error(client.post(CHAT, content=body), 400, "invalid_request")


def test_an_escaped_surrogate_pair_is_one_character_and_welcome(client: TestClient) -> None:
    body = b'{"model": "\\ud83d\\ude00", "messages": []}'
    error = assert_error(client.post(CHAT, content=body), 404, "model_not_found")
    assert "\U0001f600" in str(error["message"])


def test_an_oversized_call_leaves_a_row(client: TestClient) -> None:
    assert_error(client.post(CHAT, content=b" " * (LIMIT + 1)), 413, "request_too_large")
    assert [(r["outcome"], r["http_status"], r["error_code"]) for r in call_rows(client)] == [
        ("error", 413, "request_too_large")
    ]
