"""server/door/timing.py in process: the figures from stamps, the comment before [DONE], and the
trailer sent where the ASGI server offers trailers and the client asked for them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from fitbox.server.door.timing import STAMPS_STATE, TRAILERS, ServerTimingMiddleware
from fitbox.server.streams import Reshape
from fitbox.server.streams.events import figures


def test_figures_split_the_wait_into_queue_and_load() -> None:
    stamps = {
        "received_at": 100.0,
        "load_start_at": 100.5,
        "load_ready_at": 102.5,
        "admitted_at": 103.0,
        "first_byte_at": 103.25,
        "last_byte_at": 104.0,
    }
    assert figures(stamps) == {"queue": 1000.0, "load": 2000.0, "ttft": 3250.0, "total": 4000.0}
    # a load another call started before this one arrived counts from this one's arrival
    joined = stamps | {"load_start_at": 90.0}
    assert figures(joined)["load"] == 2500.0
    assert figures({"received_at": 1.0, "admitted_at": 1.5}) == {"queue": 500.0, "load": 0.0}


async def _stream(stamps: dict[str, float | None]) -> AsyncGenerator[bytes, None]:
    yield b'data: {"a": 1}\n\n'
    stamps["last_byte_at"] = 2.0
    yield b'data: {"b": 2}\n\ndata: [DONE]\n\n'


def test_the_comment_goes_before_done() -> None:
    async def run() -> bytes:
        stamps: dict[str, float | None] = {"received_at": 1.0, "admitted_at": 1.0}
        reshape = Reshape("/v1/completions", "m", "m", None, stamps=stamps)
        return b"".join([c async for c in reshape.stream(_stream(stamps))])

    text = asyncio.run(run())
    assert text.endswith(
        b"\n\n: server-timing queue;dur=0.0, load;dur=0.0, total;dur=1000.0\n\ndata: [DONE]\n\n"
    )


def _app(scope: Scope, receive: Receive, send: Send) -> Any:
    async def app() -> None:
        stamps: dict[str, float | None] = {"received_at": 10.0, "admitted_at": 10.1}
        scope["state"][STAMPS_STATE] = stamps
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: x\n\n", "more_body": True})
        stamps |= {"first_byte_at": 10.2, "last_byte_at": 10.5}
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app()


def _sent(extensions: dict[str, Any], headers: list[tuple[bytes, bytes]]) -> list[Message]:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def receive() -> Message:
        return {"type": "http.request", "body": b""}

    scope = {"type": "http", "extensions": extensions, "headers": headers, "state": {}}
    asyncio.run(ServerTimingMiddleware(_app)(scope, receive, send))
    return sent


def test_a_trailer_where_the_server_offers_it_and_the_client_asked() -> None:
    sent = _sent({TRAILERS: {}}, [(b"te", b"trailers")])
    start, trailers = sent[0], sent[-1]
    assert (b"server-timing", b"queue;dur=100.0, load;dur=0.0") in start["headers"]
    assert (b"trailer", b"server-timing") in start["headers"] and start["trailers"] is True
    assert trailers == {
        "type": TRAILERS,
        "more_trailers": False,
        "headers": [
            (b"server-timing", b"queue;dur=100.0, load;dur=0.0, ttft;dur=200.0, total;dur=500.0")
        ],
    }


def test_no_trailer_unasked_or_where_the_server_cannot() -> None:
    for extensions, headers in (({TRAILERS: {}}, []), ({}, [(b"te", b"trailers")])):
        sent = _sent(extensions, headers)
        assert [m["type"] for m in sent] == [
            "http.response.start",
            "http.response.body",
            "http.response.body",
        ]
        assert not sent[0]["trailers"]
        assert all(name != b"trailer" for name, _ in sent[0]["headers"])
