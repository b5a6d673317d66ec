"""Routing when a box the central thinks up refuses the call, in process: the central's own
Fleet and BoxLink, the dead box a port that refuses every connection (bound, never
listening: held by the test). It died after the mirror's last answer, a moment no real box
shows on demand (a killed box's long-poll fails at once), so the call is tried there, fails
before its first byte, and goes to the next box (a stdlib server answering as a box would),
or, with none, is a 502 to retry."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import StreamingResponse

from fitbox.central import routing
from fitbox.central.mirror import BoxLink, Fleet
from fitbox.central.store import BoxRecord, CentralStore
from fitbox.errors import EngineFailed
from fitbox.server.door.errors import error_response

from .support.local_http import JsonHandler, serve_handler


class AnsweringBox(JsonHandler):
    def do_POST(self) -> None:
        self.read_json()
        self.send_json({"object": "text_completion", "choices": []})


@pytest.fixture
def answering() -> Iterator[str]:
    with serve_handler(AnsweringBox) as url:
        yield url


def _link(fleet: Fleet, box_id: str, url: str) -> BoxLink:
    record = BoxRecord(box_id, "n", "0.1", url, "k", 0.0, None, None)
    fleet.links[box_id] = link = BoxLink(record, state="up")
    link.models = [{"id": "m", "resident": True}]
    return link


def _request(body: dict[str, object]) -> Request:
    raw = json.dumps(body).encode()

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": raw, "more_body": False}

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/completions",
        "headers": [],
        "query_string": b"",
    }
    return Request(scope, receive)


async def _refused_everywhere(tmp_path: Path, port: int) -> EngineFailed:
    store = CentralStore(tmp_path / "central.sqlite3")
    async with httpx.AsyncClient() as client:
        fleet = Fleet(store, client)
        link = _link(fleet, "box-1", f"http://127.0.0.1:{port}")
        try:
            with pytest.raises(EngineFailed) as caught:
                await routing.forward(_request({"model": "m"}), fleet, "/v1/completions")
        finally:
            await fleet.close()
            store.close()
    assert link.in_flight == 0 and link.refused_calls
    return caught.value


def test_no_box_could_take_the_call_is_a_502_to_retry(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))  # bound, not listening: every connection is refused
        error = asyncio.run(_refused_everywhere(tmp_path, held.getsockname()[1]))
    answer = error_response(error)
    assert answer.status_code == 502
    assert answer.headers["x-should-retry"] == "true"
    assert int(answer.headers["retry-after"]) >= 1
    body = json.loads(bytes(answer.body))["error"]
    assert "box-1" in body["message"] and "GET /v1/fleet" in body["message"]


async def _retried(tmp_path: Path, dead: int, answering: str) -> dict[str, str]:
    store = CentralStore(tmp_path / "central.sqlite3")
    async with httpx.AsyncClient() as client:
        fleet = Fleet(store, client)
        first = _link(fleet, "box-1", f"http://127.0.0.1:{dead}")  # the lower id: tried first
        _link(fleet, "box-2", answering)
        try:
            response = await routing.forward(_request({"model": "m"}), fleet, "/v1/completions")
            assert response.status_code == 200
            assert isinstance(response, StreamingResponse)
            async for _ in response.body_iterator:
                pass
            headers = dict(response.headers)
        finally:
            await fleet.close()
            store.close()
    assert first.refused_calls  # left out of bare-name calls until its mirror hears from it
    return headers


def test_a_box_dead_before_its_first_byte_is_retried_on_the_next(
    tmp_path: Path, answering: str
) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        headers = asyncio.run(_retried(tmp_path, held.getsockname()[1], answering))
    assert headers["x-fitbox-box"] == "box-2"
    assert headers["x-fitbox-retried-from"].startswith("box-1 ")
