"""fitbox's uvicorn server wakes once a second while idle, not ten times, and still exits
the moment it is told to: its main loop waits on an event, not a 0.1 s poll."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from typing import Any

import httpx
import pytest
import uvicorn

from fitbox import quiet_server
from fitbox.quiet_server import QuietServer
from tests.support.holds import until


async def hello(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"hello"})


class Counted(QuietServer):
    """Counts its main loop's ticks: each is a wake-up of the event loop while idle."""

    ticks = 0

    async def on_tick(self, counter: int) -> bool:
        self.ticks += 1
        return await super().on_tick(counter)


def started(server: QuietServer) -> tuple[threading.Thread, socket.socket]:
    sock = socket.create_server(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
    thread.start()
    until(lambda: server.started, "uvicorn listening")
    return thread, sock


def config() -> uvicorn.Config:
    return uvicorn.Config(hello, lifespan="off", log_level="error")


def test_an_idle_server_ticks_once_a_second_and_still_sends_a_date() -> None:
    server = Counted(config())
    thread, sock = started(server)
    try:
        began, ticks = time.monotonic(), server.ticks
        answer = httpx.get(f"http://127.0.0.1:{sock.getsockname()[1]}/")
        assert answer.text == "hello" and answer.headers["date"].endswith("GMT")
        time.sleep(2.5)  # an upper bound only: a slower machine ticks fewer times, not more
        elapsed = time.monotonic() - began
        # uvicorn's own loop ticks every 0.1 s: 25 here; this one at most once a second
        assert server.ticks - ticks <= elapsed / quiet_server.TICK_S + 1
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
    assert not thread.is_alive()


@pytest.mark.parametrize("how", ["attribute", "signal handler"])
def test_told_to_exit_it_exits_without_waiting_for_its_tick(
    how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tick is an hour here: only the event can wake the loop in time."""
    monkeypatch.setattr(quiet_server, "TICK_S", 3600.0)
    server = Counted(config())
    thread, sock = started(server)
    try:
        if how == "attribute":
            server.should_exit = True  # from another thread, as a test or an embedder does
        else:
            server.handle_exit(15, None)  # what uvicorn's SIGTERM handler calls
        thread.join(30)
        assert not thread.is_alive(), "the server slept on past its exit"
        assert server.ticks <= 2  # the first tick and the one the exit woke, no more
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def test_accept_failures_are_logged_once_a_minute_not_per_attempt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """asyncio retries a listener out of descriptors (EMFILE) many times a second, each a
    call to the loop's exception handler; the log hears of it once, other errors as ever."""
    loop = asyncio.new_event_loop()
    try:
        quiet_server.hush_accept_failures(loop)
        with caplog.at_level(logging.WARNING):
            for _ in range(1000):
                loop.call_exception_handler(
                    {"message": quiet_server.ACCEPT_FAILED, "exception": OSError(24, "EMFILE")}
                )
            loop.call_exception_handler({"message": "something else"})
    finally:
        loop.close()
    accepts = [r for r in caplog.records if "cannot accept" in r.getMessage()]
    assert len(accepts) == 1
    assert any("something else" in r.getMessage() for r in caplog.records)
