"""server/door/connections.py under a real uvicorn on loopback (in a thread, no fitbox): a
streamed reply whose reader stopped is cut off, and the deadlines wait while the server is
the one holding things up (a reply still being made, a body not yet asked for). Deadlines
are set far below the test's bounds; each wait is for an event (a deadline's own call,
seen through a spy), never for time to pass."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from fitbox.server.door import connections
from fitbox.server.door.connections import http_protocol
from fitbox.server.door.limits import ConnectionLimits

from .support.holds import until

BOUND_S = 30.0
SHORT = ConnectionLimits(head_timeout=0.3, body_timeout=0.3, send_stall_timeout=0.3)


class App:
    """``/stream``: 256 MiB in 64 KiB blocks; ``/held``: answers once the test opens
    ``gate``, reading the body first (``Expect: 100-continue`` is answered then)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.stream_ended = threading.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/stream":
            await self.stream(send)
            return
        await asyncio.to_thread(self.gate.wait, BOUND_S)
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        reply = b"held:" + body
        headers = [(b"content-length", str(len(reply)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": reply})

    async def stream(self, send: Any) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            block = b"\0" * (64 << 10)
            for _ in range(4096):
                await send({"type": "http.response.body", "body": block, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            self.stream_ended.set()


@contextlib.contextmanager
def served(app: App, limits: ConnectionLimits = SHORT) -> Iterator[tuple[str, int]]:
    sock = socket.create_server(("127.0.0.1", 0))
    protocol = http_protocol(limits)
    config = uvicorn.Config(app, http=protocol, lifespan="off", log_level="error")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
    thread.start()
    try:
        until(lambda: server.started, "uvicorn listening")
        yield "127.0.0.1", sock.getsockname()[1]
    finally:
        app.gate.set()
        server.should_exit = True
        thread.join(BOUND_S)
        sock.close()


def calls_of(monkeypatch: pytest.MonkeyPatch, name: str) -> list[None]:
    """A spy on the guarded protocol's deadline ``name``: one entry per time it fell."""
    seen: list[None] = []
    real = getattr(connections.GuardedHttpToolsProtocol, name)

    def spied(self: Any) -> None:
        seen.append(None)
        real(self)

    monkeypatch.setattr(connections.GuardedHttpToolsProtocol, name, spied)
    return seen


def reply_of(sock: socket.socket) -> bytes:
    got = b""
    while b"\r\n\r\n" not in got or not got.split(b"\r\n\r\n", 1)[1]:
        block = sock.recv(1 << 16)
        assert block, got
        got += block
    return got


def test_a_streamed_reply_whose_reader_stopped_is_cut_off() -> None:
    app = App()
    with served(app) as address, socket.socket() as stalled:
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.settimeout(BOUND_S)
        stalled.connect(address)
        stalled.sendall(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        assert stalled.recv(12) == b"HTTP/1.1 200"  # then nothing more is read
        assert app.stream_ended.wait(BOUND_S), "the stalled reader's reply never ended"


def test_a_reply_being_made_is_not_cut_by_the_next_heads_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    head_late = calls_of(monkeypatch, "_head_late")
    app = App()
    with served(app) as address, socket.create_connection(address, BOUND_S) as sock:
        # a whole request, then the first line of the next while the first is still made
        sock.sendall(b"GET /held HTTP/1.1\r\nHost: x\r\n\r\nGET /held HTTP/1.1\r\n")
        until(lambda: len(head_late) >= 2, "the next head's deadline falling", BOUND_S)
        app.gate.set()
        assert reply_of(sock).startswith(b"HTTP/1.1 200"), "the first reply was cut"


def test_a_body_not_yet_asked_for_is_not_late(monkeypatch: pytest.MonkeyPatch) -> None:
    body_late = calls_of(monkeypatch, "_body_late")
    app = App()
    with served(app) as address, socket.create_connection(address, BOUND_S) as sock:
        sock.sendall(
            b"POST /held HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"
        )
        until(lambda: len(body_late) >= 2, "the body's deadline falling", BOUND_S)
        app.gate.set()
        assert sock.recv(1 << 10).startswith(b"HTTP/1.1 100 Continue")
        sock.sendall(b"hello")
        reply = reply_of(sock)
        assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"held:hello")
