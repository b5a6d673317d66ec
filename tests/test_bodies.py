"""The one body parser (server/bodies.py) in-process: a bounded body, and every malformed
body a 4xx with an OpenAI error body. No engine is launched."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from starlette.types import Message, Scope

from fitbox import config
from fitbox.server.app import create_app

from .ggufs import write_tiny_llama
from .test_app import assert_error

LIMIT = 1024  # FITBOX_MAX_BODY in these tests
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
        create_app(cfg), client=("127.0.0.1", 50000), raise_server_exceptions=False
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
        return {"type": "http.request", "body": chunks[pulled - 1],
                "more_body": pulled < len(chunks)}  # fmt: skip

    async def send(message: Message) -> None:
        sent.append(message)

    scope: Scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": CHAT, "raw_path": CHAT.encode(), "query_string": b"",
        "root_path": "", "client": ("127.0.0.1", 50000), "server": ("testserver", 80),
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
    }  # fmt: skip
    assert client.portal is not None
    client.portal.call(client.app, scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    got = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], got, pulled


# -- the limit -------------------------------------------------------------------------------


def test_a_declared_body_over_the_limit_is_refused_before_a_byte_is_read(
    client: TestClient,
) -> None:
    chunks = [b"x" * 512] * 40
    status, headers, pulled = drive(client, {"content-length": str(10 << 20)}, chunks)
    assert (status, pulled) == (413, 0)
    assert headers["connection"] == "close"  # the unread rest cannot be the next request


def test_a_chunked_body_is_refused_once_it_passes_the_limit(client: TestClient) -> None:
    chunks = [b"x" * 512] * 40
    status, headers, pulled = drive(client, {"transfer-encoding": "chunked"}, chunks)
    assert (status, pulled) == (413, 3)  # 512, 1024, 1536 > 1024: the rest is never read
    assert headers["connection"] == "close"


def test_an_oversized_body_is_an_openai_413_that_names_the_setting(client: TestClient) -> None:
    response = client.post(CHAT, content=b" " * (LIMIT + 1))
    error = assert_error(response, 413, "request_too_large")
    assert error["type"] == "invalid_request_error"
    assert "FITBOX_MAX_BODY" in str(error["message"]) and "1.00 KiB" in str(error["message"])


def test_a_body_at_the_limit_is_read(client: TestClient) -> None:
    body = b'{"model": "nope", "messages": []}'
    response = client.post(CHAT, content=body + b" " * (LIMIT - len(body)))
    assert_error(response, 404, "model_not_found")


def test_the_limit_is_a_setting_with_a_default() -> None:
    assert config.load({}, env={}).max_body == 32 << 20
    assert config.load({}, env={"FITBOX_MAX_BODY": "64MiB"}).max_body == 64 << 20
    with pytest.raises(config.ConfigError, match="FITBOX_MAX_BODY"):
        config.load({}, env={"FITBOX_MAX_BODY": "0"})
