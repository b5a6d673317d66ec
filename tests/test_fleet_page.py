"""The central's fleet page and /metrics in process, on a real SQLite store: a registered box
shown with its state, a box's name escaped, the outside refused without a key (the box's
rules: the page needs admin, /metrics read), and /metrics parsed by prometheus_client with
per-box series, its calls by outcome counted from the mirrored rows once each (a pending row
counted when it ends)."""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from fitbox import config as settings
from fitbox.central.app import create_central_app
from fitbox.central.mirror import BoxLink
from fitbox.central.page import state_of
from fitbox.central.store import BoxRecord, CentralStore
from fitbox.cli.central import CENTRAL_SCOPES
from fitbox.store.keys import create_key

LOCAL = ("127.0.0.1", 50000)
HOST = "http://127.0.0.1"  # a name for the central itself (the door refuses another's)
OUTSIDE = ("203.0.113.9", 50000)
BOX = {
    "box_id": "0b7c1d2e-0000-4000-8000-000000000007",
    "name": "<b>gpu-7</b>",
    "version": "0.1.0",
    "url": "http://198.51.100.8:8484",
    "admin_key": "fb_000000000000_" + "x" * 43,
}


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / "central.sqlite3"


@pytest.fixture
def central(tmp_path: Path, store_path: Path) -> Iterator[TestClient]:
    config = settings.load({"home": str(tmp_path), "host": "0.0.0.0"}, env={})
    CentralStore(store_path).close()
    with TestClient(create_central_app(config, store_path), base_url=HOST, client=LOCAL) as client:
        assert client.post("/v1/boxes", json=BOX).status_code == 201
        yield client


def _key(store_path: Path, *scopes: str) -> dict[str, str]:
    store = CentralStore(store_path)
    try:
        _, secret = store.run(lambda conn: create_key(conn, "t", scopes, known=CENTRAL_SCOPES))
    finally:
        store.close()
    return {"Authorization": f"Bearer {secret}"}


def _call(row_id: int, outcome: str) -> dict[str, Any]:
    return {
        "id": row_id,
        "seq": row_id,
        "request_id": f"r{row_id}",
        "endpoint": "/v1/chat/completions",
        "model_asked": "tiny",
        "outcome": outcome,
        "received_at": 1_700_000_000.0 + row_id,
    }


def _mirror(central: TestClient, rows: list[dict[str, Any]]) -> None:
    store: CentralStore = central.app.state.store  # type: ignore[attr-defined]
    store.take_page(BOX["box_id"], "call_log", "seq", rows, max(r["seq"] for r in rows))


def _calls(text: str) -> dict[str, float]:
    return {
        s.labels["outcome"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "fitbox_central_calls_total" and s.labels["box"] == BOX["box_id"]
    }


def test_the_page_shows_each_box_escaped_with_its_state_and_recent_calls(
    central: TestClient,
) -> None:
    _mirror(central, [_call(1, "ok"), _call(2, "error")])
    page = central.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "&lt;b&gt;gpu-7&lt;/b&gt;" in page.text and "<b>gpu-7</b>" not in page.text
    assert re.search(r"<tr class='box (connecting|unreachable)'>", page.text)
    assert page.text.count("<tr class='call") == 2 and "class='call error'" in page.text
    version = re.search(r'<body data-version="([0-9a-f]+)"', page.text)
    assert version
    assert page.text.count(f'data-version="{version[1]}"') == 2  # <body> and <main>


def test_the_outside_needs_an_admin_key_for_the_page_and_read_for_metrics(
    central: TestClient, store_path: Path
) -> None:
    reader, admin = _key(store_path, "read"), _key(store_path, "admin")
    outside = TestClient(central.app, base_url=HOST, client=OUTSIDE)
    for path in ("/", "/dashboard/events", "/metrics"):
        refused = outside.get(path)
        assert refused.status_code == 401, (path, refused.text)
        assert refused.json()["error"]["code"] == "missing_api_key"
    denied = outside.get("/", headers=reader)
    assert denied.status_code == 403 and denied.json()["error"]["message"]
    assert outside.get("/", headers=admin).status_code == 200
    assert outside.get("/metrics", headers=reader).status_code == 200


def test_metrics_parse_with_per_box_series_and_count_each_call_once(
    central: TestClient,
) -> None:
    _mirror(central, [_call(1, "ok"), _call(2, "pending"), _call(3, "error")])
    first = central.get("/metrics")
    assert first.status_code == 200 and first.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(first.text)}
    for name in (
        "fitbox_central_box_up",
        "fitbox_central_box_state",
        "fitbox_central_box_info",
        "fitbox_central_box_queue_length",
        "fitbox_central_calls",
    ):
        assert any(s.labels.get("box") == BOX["box_id"] for s in families[name].samples), name
    (info,) = families["fitbox_central_box_info"].samples
    assert info.labels["name"] == BOX["name"]
    assert _calls(first.text) == {"ok": 1, "error": 1}  # the pending one is not done yet
    _mirror(central, [_call(2, "ok"), _call(4, "ok")])  # it ended; another came
    assert _calls(central.get("/metrics").text) == {"ok": 3, "error": 1}
    assert _calls(central.get("/metrics").text) == {"ok": 3, "error": 1}  # never twice


def test_idle_and_serving_come_from_the_mirrored_rows_not_the_box_snapshot(
    central: TestClient,
) -> None:
    """The residents snapshot is read again only on a change that is not a call's: the
    one the central holds says what the box said then (here: serving one call, idle 0 s)."""
    artifact = "/models/tiny.gguf"
    link: BoxLink = central.app.state.fleet.links[BOX["box_id"]]  # type: ignore[attr-defined]
    link.residents = [
        {
            "model": "tiny",
            "artifact": artifact,
            "state": "ready",
            "device": "host",
            "bytes": 2 << 20,
            "window": 512,
            "calls": 1,
            "idle_for_s": 0,
            "devices": {"host": 2 << 20},
        }
    ]
    ended = time.time() - 300
    _mirror(central, [{**_call(1, "ok"), "artifact": artifact, "last_byte_at": ended}])
    page = central.get("/").text
    assert f'data-idle-since="{ended:.3f}"' in page and "serving" not in page
    _mirror(central, [{**_call(2, "pending"), "artifact": artifact}])
    page = central.get("/").text
    assert "serving 1 call(s)" in page and "data-idle-since=" not in page


def test_a_box_state_word() -> None:
    record = BoxRecord("b", "n", "0.1.0", "http://198.51.100.8:1", "k", 0.0, None, None)
    link = BoxLink(record)
    assert state_of(link) == "connecting"
    link.state = "up"
    assert state_of(link) == "up"
    link.polling_since = time.monotonic() - link.answer_due_s - 1  # its long-poll is late
    assert state_of(link) == "suspected"
    link.polling_since = None
    link.refused_calls = True  # a call failed before its first byte there
    assert state_of(link) == "suspected"
    link.record = dataclasses.replace(record, draining=1)
    assert state_of(link) == "draining"
    link.state = "unreachable"
    assert state_of(link) == "unreachable"
