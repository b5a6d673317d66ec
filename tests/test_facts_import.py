"""Facts another box measured, imported in process (no engine): matched by the file's
sha256, priced from at once with their origin named, kept once however often offered, never
above a measurement made here, and every refusal an OpenAI-shaped error."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from fitbox import config
from fitbox.server.app import create_app
from fitbox.store.facts import (
    MeasuredFootprint,
    import_footprint,
    insert_footprint,
    latest_footprints,
)
from fitbox.store.migrations import load_migrations, migrate

from .conftest import BOX
from .ggufs import write_tiny_llama

ORIGIN = "0b7c1d2e-0000-4000-8000-00000000000a"
OUTSIDE = ("203.0.113.9", 50000)


@pytest.fixture
def box(tmp_path: Path) -> Iterator[tuple[TestClient, str, int]]:
    """A box with one model; yields the client, the file's sha256 and its size."""
    models = tmp_path / "models"
    models.mkdir()
    path = write_tiny_llama(models / "tiny.gguf")
    cfg = config.load({"home": str(tmp_path / "home"), "models": str(models)},
                      env={"FITBOX_SIMULATED_GPUS": ""})  # fmt: skip
    sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
    with TestClient(create_app(cfg), client=("127.0.0.1", 50000), base_url=BOX) as client:
        yield client, sha256, path.stat().st_size


def _row(plan: dict[str, Any], size: int, row_id: int = 7, kv: int = 12345) -> dict[str, Any]:
    """A footprint row as the measuring box's telemetry carries it, for this plan's contract."""
    return {"id": row_id, "seq": 40, "artifact": "/elsewhere/tiny.gguf", "artifact_size": size,
            "artifact_mtime_ns": 1, "device": plan["device"], "window": plan["window"],
            "parallel": plan["parallel"], "type_k": plan["type_k"], "type_v": plan["type_v"],
            "weights_bytes": 1_000_000, "kv_bytes": kv, "compute_bytes": 2000,
            "output_bytes": 300, "n_ctx": plan["window"], "n_ctx_seq": None,
            "load_seconds": 0.5, "call_id": 3, "measured_at": 1.7e9,
            "origin_box": None}  # fmt: skip


def _error(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == code and error["message"] and "type" in error and "param" in error
    return error


def test_an_imported_footprint_prices_the_plan_with_its_origin_named(
    box: tuple[TestClient, str, int],
) -> None:
    client, sha256, size = box
    before = client.get("/v1/plan", params={"model": "tiny"}).json()
    assert before["decision"] == "place" and before["basis"] == "estimate"
    offer = {"origin_box": ORIGIN, "sha256": sha256, "footprints": [_row(before, size)]}
    taken = client.post("/v1/facts/import", json=offer)
    assert taken.status_code == 200, taken.text
    assert taken.json()["files"] == [{"model": "tiny", "footprints": 1}]
    after = client.get("/v1/plan", params={"model": "tiny"}).json()
    assert after["basis"] == "imported"
    assert after["measured_by"] == {"box_id": ORIGIN, "row_id": 7, "call_id": None,
                                    "measured_at": 1.7e9}  # fmt: skip
    assert sum(d["total_bytes"] for d in after["devices"]) == 1_000_000 + 12345 + 2000 + 300
    again = client.post("/v1/facts/import", json=offer)  # a central replaying its mirror
    assert again.status_code == 200
    rows = client.get("/v1/telemetry", params={"table": "measured_footprints"}).json()["rows"]
    assert [(r["origin_box"], r["origin_id"]) for r in rows] == [(ORIGIN, 7)]  # kept once
    assert rows[0]["artifact"].endswith("/models/tiny.gguf")  # filed under this box's file


def test_an_offer_the_box_cannot_take_says_why(box: tuple[TestClient, str, int]) -> None:
    client, sha256, size = box
    plan = client.get("/v1/plan", params={"model": "tiny"}).json()
    row = _row(plan, size)
    def post(body: dict[str, Any]) -> Any:
        return client.post("/v1/facts/import", json=body)

    error = _error(post({"origin_box": ORIGIN, "sha256": "0" * 64, "footprints": [row]}), 404,
                   "no_such_file")  # fmt: skip
    assert "1 file(s)" in error["message"]
    small = {"origin_box": ORIGIN, "sha256": "0" * 64, "footprints": [{**row, "artifact_size": 5}]}
    error = _error(post(small), 404, "no_such_file")
    assert "0 file(s)" in error["message"]  # no file of that size: nothing hashed
    cases: list[tuple[dict[str, Any], str]] = [
        ({"sha256": sha256, "footprints": [row]}, "origin_box"),
        ({"origin_box": ORIGIN, "sha256": "XYZ", "footprints": [row]}, "sha256"),
        ({"origin_box": ORIGIN, "sha256": sha256, "footprints": []}, "footprints"),
        ({"origin_box": ORIGIN, "sha256": sha256, "footprints": [{**row, "kv_bytes": "lots"}]},
         "kv_bytes"),
        ({"origin_box": ORIGIN, "sha256": sha256, "footprints": [{**row, "origin_box": "x"}]},
         "origin_box"),
    ]  # fmt: skip
    for body, param in cases:
        assert _error(post(body), 400, "invalid_request")["param"] == param
    own = client.get("/health").json()["box_id"]
    error = _error(post({"origin_box": own, "sha256": sha256, "footprints": [row]}), 400,
                   "invalid_request")  # fmt: skip
    assert "this box itself" in error["message"]
    outside = TestClient(client.app, client=OUTSIDE, base_url=BOX)
    _error(outside.post("/v1/facts/import", json={}), 401, "missing_api_key")  # management


def test_a_measurement_made_here_wins_over_an_imported_one(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "s.sqlite3")
    conn.row_factory = sqlite3.Row
    migrate(conn, load_migrations())
    base = MeasuredFootprint("/m/t.gguf", 10, 1, "host", 512, 1, "f16", "f16", 100, 10, 5, 1)
    imported = MeasuredFootprint(**{**base.__dict__, "kv": 99, "origin_box": ORIGIN,
                                    "origin_id": 4})  # fmt: skip
    insert_footprint(conn, base)  # measured here first
    assert import_footprint(conn, imported) is not None
    assert import_footprint(conn, imported) is None  # the same offer twice: kept once
    (only,) = latest_footprints(conn)
    assert only.origin_box is None and only.kv == 10  # imported later, still not preferred
    other = MeasuredFootprint(**{**base.__dict__, "window": 1024, "origin_box": ORIGIN,
                                 "origin_id": 5})  # fmt: skip
    import_footprint(conn, other)
    found = {m.window: m for m in latest_footprints(conn)}
    assert found[1024].origin_box == ORIGIN and found[1024].origin_id == 5  # nothing local
