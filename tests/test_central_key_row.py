"""The central key a call through the central was made with, on the box's call row: the
central names it (``x-fitbox-central-key``: its id and name, never its secret) and the box
believes it only on a request made with the box's own key, which it handed its central
alone. The same header from any other caller (another admin key, an inference key, a
trusted peer without a key) is ignored: an identity cannot be borrowed. In process: the
box's app without an engine (a call to a model it lacks still gets its row), and the
central's forwarding to a stdlib server that records what it was sent."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import StreamingResponse

from fitbox import config
from fitbox.central import routing
from fitbox.central.mirror import BoxLink, Fleet
from fitbox.central.store import BoxRecord, CentralStore
from fitbox.server.manage.joining import CENTRAL_KEY_HEADER, central_key_header
from fitbox.store.keys import ApiKey, create_key

from .support.clients import app_client, call_rows
from .support.ggufs import write_tiny_llama
from .support.local_http import JsonHandler, serve_handler

LOCAL, OUTSIDE = ("127.0.0.1", 5000), ("203.0.113.5", 5000)
SAID = {CENTRAL_KEY_HEADER: central_key_header("0123456789ab", "alice's laptop")}
CALL = {"model": "absent", "messages": [{"role": "user", "content": "x"}]}


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "models").mkdir()
    write_tiny_llama(tmp_path / "models" / "tiny.gguf")
    with app_client(_config(tmp_path), LOCAL):
        pass  # the first start migrates the store and writes the box key
    return tmp_path


def _config(home: Path) -> config.Config:
    return config.load({"home": str(home), "models": str(home / "models")}, env={})


def _key(home: Path, *scopes: str) -> str:
    with sqlite3.connect(home / "fitbox.sqlite3") as conn:
        return str(create_key(conn, "someone", scopes)[1])


def _row_after(home: Path, peer: tuple[str, int], key: str | None) -> dict[str, Any]:
    headers = dict(SAID)
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    with app_client(_config(home), peer) as box:
        answer = box.post("/v1/chat/completions", json=CALL, headers=headers)
        assert answer.status_code == 404, answer.text  # refused, and still recorded
        (row,) = call_rows(box)
    return row


def test_the_box_records_the_central_key_its_central_names(home: Path) -> None:
    box_key = (home / "box.key").read_text().strip()
    row = _row_after(home, OUTSIDE, box_key)
    assert (row["central_key"], row["central_key_name"]) == ("0123456789ab", "alice's laptop")
    assert box_key.split("_")[2] not in json.dumps(row)


@pytest.mark.parametrize(
    ("peer", "scopes"),
    [(OUTSIDE, ("admin",)), (OUTSIDE, ("inference",)), (LOCAL, None)],
    ids=["another-admin-key", "an-inference-key", "the-box-itself-without-a-key"],
)
def test_no_other_caller_can_say_which_central_key_it_is(
    home: Path, peer: tuple[str, int], scopes: tuple[str, ...] | None
) -> None:
    row = _row_after(home, peer, _key(home, *scopes) if scopes else None)
    assert (row["central_key"], row["central_key_name"]) == (None, None)


def test_the_calls_page_shows_the_central_key(home: Path) -> None:
    _row_after(home, OUTSIDE, (home / "box.key").read_text().strip())
    with app_client(_config(home), LOCAL) as box:
        page = box.get("/calls")
    assert page.status_code == 200 and "alice&#x27;s laptop (0123456789ab)" in page.text


class RecordingBox(JsonHandler):
    seen: ClassVar[list[dict[str, str]]] = []

    def do_POST(self) -> None:
        self.read_json()
        RecordingBox.seen.append({k.lower(): v for k, v in self.headers.items()})
        self.send_json({})


@pytest.fixture
def recording() -> Iterator[str]:
    RecordingBox.seen.clear()
    with serve_handler(RecordingBox) as url:
        yield url


def _request(key: ApiKey | None, headers: dict[str, str]) -> Request:
    raw = json.dumps({"model": "m"}).encode()

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": raw, "more_body": False}

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/completions",
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
        "query_string": b"",
        "state": {"api_key": key},
    }
    return Request(scope, receive)


async def _forwarded(tmp_path: Path, url: str, key: ApiKey | None) -> None:
    store = CentralStore(tmp_path / "central.sqlite3")
    async with httpx.AsyncClient() as client:
        fleet = Fleet(store, client)
        record = BoxRecord("box-1", "n", "0.1", url, "the-box-key", 0.0, None, None)
        fleet.links["box-1"] = link = BoxLink(record, state="up")
        link.models = [{"id": "m", "resident": True}]
        try:
            forged = {CENTRAL_KEY_HEADER: "ffffffffffff someone-else"}  # the client's own
            response = await routing.forward(_request(key, forged), fleet, "/v1/completions")
            assert isinstance(response, StreamingResponse)
            async for _ in response.body_iterator:
                pass
        finally:
            await fleet.close()
            store.close()


def test_the_central_names_the_key_a_call_came_with_and_no_client_s_word(
    tmp_path: Path, recording: str
) -> None:
    key = ApiKey("0123456789ab", "alice's laptop", ("inference",), None, 0.0, None, None, False)
    asyncio.run(_forwarded(tmp_path, recording, key))
    asyncio.run(_forwarded(tmp_path, recording, None))  # the central's own host, no key
    said, unsaid = RecordingBox.seen
    assert said["authorization"] == "Bearer the-box-key"
    assert said[CENTRAL_KEY_HEADER] == "0123456789ab alice%27s%20laptop"
    assert CENTRAL_KEY_HEADER not in unsaid
