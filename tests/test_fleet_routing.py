"""Routing's answers when no box takes a call, in process: the central's own Fleet and
BoxLink, the box a port that refuses every connection (bound, never listening: held by the
test). The central still thinks the box up (it died after the mirror's last answer, a
moment no real box shows on demand), so the call is tried there and fails before its first
byte."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import httpx
import pytest
from starlette.requests import Request

from fitbox.central import routing
from fitbox.central.mirror import BoxLink, Fleet
from fitbox.central.store import BoxRecord, CentralStore
from fitbox.errors import EngineFailed
from fitbox.server.door.errors import error_response


def _request(body: dict[str, object]) -> Request:
    raw = json.dumps(body).encode()

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": raw, "more_body": False}

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}
    return Request(scope, receive)


async def _refused_everywhere(tmp_path: Path, port: int) -> EngineFailed:
    store = CentralStore(tmp_path / "central.sqlite3")
    async with httpx.AsyncClient() as client:
        fleet = Fleet(store, client)
        record = BoxRecord("box-1", "n", "0.1", f"http://127.0.0.1:{port}", "k", 0.0, None, None)
        fleet.links["box-1"] = link = BoxLink(record, state="up")
        link.models = [{"id": "m", "resident": True}]
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
