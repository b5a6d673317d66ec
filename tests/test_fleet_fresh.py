"""GET /v1/fleet counts what moves with calls when it is read: a resident's calls, slots and
idle time from the mirrored rows (the same functions as the fleet page, central/fresh.py),
not from the residents snapshot the box gave at its last change that was not a call's; its
memory from the newest mirrored reading, each figure with the moment it was read and its
age. And the mirror takes readings (which move no counter) at a long-poll answer that
brings no change, so a quiet box's memory is never older than a long-poll's wait."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from starlette.testclient import TestClient

from fitbox import config as settings
from fitbox.central import mirror
from fitbox.central.app import create_central_app
from fitbox.central.mirror import BoxLink, Fleet
from fitbox.central.store import BoxRecord, CentralStore

from .support.local_http import JsonHandler, serve_handler

LOCAL = ("127.0.0.1", 50000)
HOST = "http://127.0.0.1"
BOX = {
    "box_id": "0b7c1d2e-0000-4000-8000-000000000009",
    "name": "gpu-9",
    "version": "0.1.0",
    "url": "http://198.51.100.9:8484",
    "admin_key": "fb_000000000000_" + "x" * 43,
}
ARTIFACT = "/models/tiny.gguf"


@pytest.fixture
def central(tmp_path: Path) -> Iterator[TestClient]:
    config = settings.load({"home": str(tmp_path), "host": "0.0.0.0"}, env={})
    path = tmp_path / "central.sqlite3"
    CentralStore(path).close()
    with TestClient(create_central_app(config, path), base_url=HOST, client=LOCAL) as client:
        assert client.post("/v1/boxes", json=BOX).status_code == 201
        yield client


def _resident(**changed: Any) -> dict[str, Any]:
    """The box's snapshot of a resident, as it was at the last change that was not a call."""
    return {
        "model": "tiny",
        "artifact": ARTIFACT,
        "state": "ready",
        "device": "gpu0",
        "bytes": 2 << 20,
        "window": 512,
        "parallel": 2,
        "calls": 2,
        "slots_taken": 2,
        "idle_for_s": 0,
        "devices": {"gpu0": 2 << 20},
        **changed,
    }


def _call(row_id: int, outcome: str, **more: Any) -> dict[str, Any]:
    return {
        "id": row_id,
        "seq": row_id,
        "request_id": f"r{row_id}",
        "endpoint": "/v1/chat/completions",
        "model_asked": "tiny",
        "artifact": ARTIFACT,
        "outcome": outcome,
        "received_at": time.time() - 400,
        **more,
    }


def _box(central: TestClient) -> dict[str, Any]:
    (box,) = central.get("/v1/fleet").json()["data"]
    assert isinstance(box, dict)
    return box


def test_the_fleet_counts_calls_slots_and_idle_time_from_the_mirrored_rows(
    central: TestClient,
) -> None:
    store: CentralStore = central.app.state.store  # type: ignore[attr-defined]
    link: BoxLink = central.app.state.fleet.links[BOX["box_id"]]  # type: ignore[attr-defined]
    link.residents = [_resident()]  # serving two calls, when the box last said
    link.snapshot_at = time.time() - 300
    ended = time.time() - 120
    store.take_page(BOX["box_id"], "call_log", "seq", [_call(1, "ok", last_byte_at=ended)], 1)
    box = _box(central)
    (resident,) = box["residents"]
    assert (resident["calls"], resident["slots_taken"], resident["slots_free"]) == (0, 0, 2)
    assert resident["idle_since"] == pytest.approx(ended)
    assert 119 <= resident["idle_for_s"] <= box["read_at"] - ended + 1
    assert 299 <= box["residents_age_s"] <= 301
    store.take_page(BOX["box_id"], "call_log", "seq", [_call(2, "pending")], 2)
    (resident,) = _box(central)["residents"]
    assert (resident["calls"], resident["slots_taken"], resident["slots_free"]) == (1, 1, 1)
    assert resident["idle_for_s"] == 0


def test_the_fleet_shows_memory_from_the_newest_reading_with_its_age(
    central: TestClient,
) -> None:
    store: CentralStore = central.app.state.store  # type: ignore[attr-defined]
    link: BoxLink = central.app.state.fleet.links[BOX["box_id"]]  # type: ignore[attr-defined]
    link.residents = [_resident()]
    read = time.time() - 7
    readings = [
        {"id": 1, "at": read - 60, "device": "gpu0", "total_bytes": 8 << 30, "free_bytes": 1},
        {"id": 2, "at": read, "device": "gpu0", "total_bytes": 8 << 30, "free_bytes": 5 << 30},
    ]
    store.take_page(BOX["box_id"], "resource_log", "id", readings, 2)
    box = _box(central)
    (gpu,) = box["devices"]
    assert gpu["device"] == "gpu0" and gpu["free_bytes"] == 5 << 30
    assert (gpu["total_bytes"], gpu["held_bytes"]) == (8 << 30, 2 << 20)
    assert gpu["read_at"] == pytest.approx(read) and 6 <= gpu["age_s"] <= 9
    assert box["waiting_read_at"] is None and box["waiting_age_s"] is None  # never answered


class QuietBox(JsonHandler):
    """A box whose counter never moves: its long-poll answers after a short wait with no
    change, and each read of its readings finds one taken since."""

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        answer: Any
        if url.path == "/v1/telemetry/state":
            if int(query.get("since", "-1")) >= 1:
                time.sleep(0.2)  # the wait, with nothing new
            answer = {"counter": 1, "changed": [], "waiting": 0}
        elif url.path == "/v1/telemetry":
            answer = {"table": query["table"], "cursor": "seq", "rows": [], "next": 0}
            if query["table"] == "resource_log":
                row = int(query["since"]) + 1
                reading = {"id": row, "at": time.time(), "device": "host", "free_bytes": row}
                answer |= {"cursor": "id", "rows": [reading], "next": row}
        else:  # /health, /v1/residents, /v1/models
            answer = {"status": "ok", "data": []}
        self.send_json(answer)


@pytest.fixture
def quiet_box() -> Iterator[str]:
    with serve_handler(QuietBox) as url:
        yield url


async def _readings_taken(tmp_path: Path, url: str) -> list[float]:
    store = CentralStore(tmp_path / "central.sqlite3")
    taken: list[float] = []
    async with httpx.AsyncClient() as client:
        fleet = Fleet(store, client, long_poll_s=0.2)
        fleet.follow(BoxRecord("quiet", "q", "0.1", url, "k", 0.0, None, None))
        try:
            for _ in range(60):
                await asyncio.sleep(0.1)
                rows = store.mirrored("resource_log", "quiet", 1, 0, True)
                if rows and (not taken or rows[0]["at"] > taken[-1]):
                    taken.append(rows[0]["at"])
                if len(taken) >= 3:
                    break
        finally:
            await fleet.close()
            store.close()
    return taken


def test_a_quiet_box_s_readings_are_taken_at_its_long_poll_answers(
    tmp_path: Path, quiet_box: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mirror, "READINGS_EVERY_S", 0.3)
    taken = asyncio.run(_readings_taken(tmp_path, quiet_box))
    assert len(taken) >= 3, taken  # its counter never moved after the first answer
