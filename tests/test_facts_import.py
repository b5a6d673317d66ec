"""Facts another box measured (footprints, refused windows, speeds), imported in process (no
engine): matched by the file's sha256, priced from at once with their origin named, kept
once however often offered, never above a measurement made here, and every refusal an
OpenAI-shaped error."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from fitbox import config
from fitbox.store.facts import (
    MeasuredFootprint,
    import_footprint,
    insert_footprint,
    latest_footprints,
)
from fitbox.store.migrations import load_migrations, migrate

from .support.clients import app_client
from .support.ggufs import write_tiny_llama
from .support.paths import BOX

ORIGIN = "0b7c1d2e-0000-4000-8000-00000000000a"
OUTSIDE = ("203.0.113.9", 50000)


@pytest.fixture
def box(tmp_path: Path) -> Iterator[tuple[TestClient, str, int]]:
    """A box with one model; yields the client, the file's sha256 and its size."""
    models = tmp_path / "models"
    models.mkdir()
    path = write_tiny_llama(models / "tiny.gguf", n_ctx=2048)  # a band of windows to cap
    cfg = config.load(
        {"home": str(tmp_path / "home"), "models": str(models)}, env={"FITBOX_SIMULATED_GPUS": ""}
    )
    sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
    with app_client(cfg) as client:
        yield client, sha256, path.stat().st_size


def _row(plan: dict[str, Any], size: int, row_id: int = 7, kv: int = 12345) -> dict[str, Any]:
    """A footprint row as the measuring box's telemetry carries it, for this plan's contract."""
    return {
        "id": row_id,
        "seq": 40,
        "artifact": "/elsewhere/tiny.gguf",
        "artifact_size": size,
        "artifact_mtime_ns": 1,
        "device": plan["device"],
        "window": plan["window"],
        "parallel": plan["parallel"],
        "type_k": plan["type_k"],
        "type_v": plan["type_v"],
        "weights_bytes": 1_000_000,
        "kv_bytes": kv,
        "compute_bytes": 2000,
        "output_bytes": 300,
        "n_ctx": plan["window"],
        "n_ctx_seq": None,
        "load_seconds": 0.5,
        "call_id": 3,
        "measured_at": 1.7e9,
        "origin_box": None,
    }


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
    assert after["measured_by"] == {
        "box_id": ORIGIN,
        "row_id": 7,
        "call_id": None,
        "measured_at": 1.7e9,
    }
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

    error = _error(
        post({"origin_box": ORIGIN, "sha256": "0" * 64, "footprints": [row]}), 404, "no_such_file"
    )
    assert "1 file(s)" in error["message"]
    small = {"origin_box": ORIGIN, "sha256": "0" * 64, "footprints": [{**row, "artifact_size": 5}]}
    error = _error(post(small), 404, "no_such_file")
    assert "0 file(s)" in error["message"]  # no file of that size: nothing hashed
    cases: list[tuple[dict[str, Any], str]] = [
        ({"sha256": sha256, "footprints": [row]}, "origin_box"),
        ({"origin_box": ORIGIN, "sha256": "XYZ", "footprints": [row]}, "sha256"),
        ({"origin_box": ORIGIN, "sha256": sha256, "footprints": []}, "footprints"),
        (
            {"origin_box": ORIGIN, "sha256": sha256, "footprints": [{**row, "kv_bytes": "lots"}]},
            "kv_bytes",
        ),
        (
            {"origin_box": ORIGIN, "sha256": sha256, "footprints": [{**row, "origin_box": "x"}]},
            "origin_box",
        ),
    ]
    for body, param in cases:
        assert _error(post(body), 400, "invalid_request")["param"] == param
    own = client.get("/health").json()["box_id"]
    error = _error(
        post({"origin_box": own, "sha256": sha256, "footprints": [row]}), 400, "invalid_request"
    )
    assert "this box itself" in error["message"]
    outside = TestClient(client.app, client=OUTSIDE, base_url=BOX)
    _error(outside.post("/v1/facts/import", json={}), 401, "missing_api_key")  # management


def test_a_measurement_made_here_wins_over_an_imported_one(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "s.sqlite3")
    conn.row_factory = sqlite3.Row
    migrate(conn, load_migrations())
    base = MeasuredFootprint("/m/t.gguf", 10, 1, "host", 512, 1, "f16", "f16", 100, 10, 5, 1)
    imported = MeasuredFootprint(
        **{**base.__dict__, "kv": 99, "origin_box": ORIGIN, "origin_id": 4}
    )
    insert_footprint(conn, base)  # measured here first
    assert import_footprint(conn, imported) is not None
    assert import_footprint(conn, imported) is None  # the same offer twice: kept once
    (only,) = latest_footprints(conn)
    assert only.origin_box is None and only.kv == 10  # imported later, still not preferred
    other = MeasuredFootprint(
        **{**base.__dict__, "window": 1024, "origin_box": ORIGIN, "origin_id": 5}
    )
    import_footprint(conn, other)
    found = {m.window: m for m in latest_footprints(conn)}
    assert found[1024].origin_box == ORIGIN and found[1024].origin_id == 5  # nothing local


def _speed_row(
    plan: dict[str, Any], size: int, row_id: int = 9, decode_ms: float = 50.0
) -> dict[str, Any]:
    """A measured_speeds row as the measuring box's telemetry carries it."""
    return {
        "id": row_id,
        "seq": 41,
        "artifact": "/elsewhere/tiny.gguf",
        "artifact_size": size,
        "artifact_mtime_ns": 1,
        "rung": plan["rung"],
        "placement": plan["device"],
        "prompt_tokens": 12,
        "prompt_per_token_ms": 4.0,
        "decode_tokens": 64,
        "decode_per_token_ms": decode_ms,
        "call_id": 3,
        "measured_at": 1.7e9,
        "cores": 2,
        "origin_box": None,
    }


def _window_row(plan: dict[str, Any], size: int, window: int, row_id: int = 11) -> dict[str, Any]:
    """A refused_windows row as the measuring box's telemetry carries it."""
    return {
        "id": row_id,
        "seq": 42,
        "artifact": "/elsewhere/tiny.gguf",
        "artifact_size": size,
        "artifact_mtime_ns": 1,
        "placement": plan["device"],
        "window": window,
        "type_k": plan["type_k"],
        "type_v": plan["type_v"],
        "detail": "cudaMalloc failed: out of memory",
        "call_id": 3,
        "measured_at": 1.7e9,
        "origin_box": None,
    }


def test_an_imported_speed_gives_the_eta_with_its_origin_named(
    box: tuple[TestClient, str, int],
) -> None:
    """A footprint gives the load's seconds; without a decode rate the ETA of a call with
    output tokens is unknown (never guessed); another box's speed gives it."""
    client, sha256, size = box
    plan = client.get("/v1/plan", params={"model": "tiny"}).json()
    offer = {"origin_box": ORIGIN, "sha256": sha256, "footprints": [_row(plan, size)]}
    assert client.post("/v1/facts/import", json=offer).status_code == 200
    asked: dict[str, str | int] = {"model": "tiny", "max_tokens": 100}
    before = client.get("/v1/plan", params=asked).json()
    assert before["predicted_seconds"] is None and before["speeds_measured_by"] == []
    offer = {"origin_box": ORIGIN, "sha256": sha256, "speeds": [_speed_row(plan, size)]}
    taken = client.post("/v1/facts/import", json=offer)
    assert taken.status_code == 200, taken.text
    assert taken.json()["files"] == [{"model": "tiny", "speeds": 1}]
    after = client.get("/v1/plan", params=asked).json()
    assert after["predicted_seconds"] == pytest.approx(0.5 + 100 * 50.0 / 1000)
    assert after["speeds_measured_by"] == [ORIGIN]
    assert client.post("/v1/facts/import", json=offer).status_code == 200  # replayed
    rows = client.get("/v1/telemetry", params={"table": "measured_speeds"}).json()["rows"]
    assert [(r["origin_box"], r["origin_id"]) for r in rows] == [(ORIGIN, 9)]  # kept once
    assert rows[0]["artifact"].endswith("/models/tiny.gguf")  # filed under this box's file


def test_an_imported_refused_window_is_not_tried_first_and_names_its_origin(
    box: tuple[TestClient, str, int],
) -> None:
    client, sha256, size = box
    plan = client.get("/v1/plan", params={"model": "tiny"}).json()
    top = plan["band"]["max"]
    assert plan["refused_windows"] == []
    offer = {
        "origin_box": ORIGIN,
        "sha256": sha256,
        "refused_windows": [_window_row(plan, size, top)],
    }
    taken = client.post("/v1/facts/import", json=offer)
    assert taken.status_code == 200, taken.text
    assert taken.json()["files"] == [{"model": "tiny", "refused_windows": 1}]
    after = client.get("/v1/plan", params={"model": "tiny"}).json()
    assert after["decision"] == "place" and after["band"]["max"] < top
    assert after["refused_windows"] == [
        {"device": plan["device"], "window": top, "origin_box": ORIGIN}
    ]
    assert client.post("/v1/facts/import", json=offer).status_code == 200  # replayed
    rows = client.get("/v1/telemetry", params={"table": "refused_windows"}).json()["rows"]
    assert [(r["origin_box"], r["origin_id"], r["window"]) for r in rows] == [(ORIGIN, 11, top)]


def test_offered_windows_and_speeds_the_box_cannot_take_say_why(
    box: tuple[TestClient, str, int],
) -> None:
    client, sha256, size = box
    plan = client.get("/v1/plan", params={"model": "tiny"}).json()
    window, rate = _window_row(plan, size, 512), _speed_row(plan, size)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"refused_windows": [{**window, "window": -1}]}, "window"),
        ({"refused_windows": [{**window, "placement": 3}]}, "placement"),
        ({"refused_windows": [{**window, "origin_box": "x"}]}, "origin_box"),
        ({"speeds": [{**rate, "rung": "warp-drive"}]}, "rung"),
        (
            {"speeds": [{**rate, "prompt_per_token_ms": None, "decode_per_token_ms": None}]},
            "decode_per_token_ms",
        ),
        ({"speeds": [{**rate, "decode_per_token_ms": "fast"}]}, "decode_per_token_ms"),
        ({"speeds": {"not": "a list"}}, "speeds"),
        (
            {"speeds": [rate], "refused_windows": [{**window, "artifact_size": size + 1}]},
            "artifact_size",
        ),
        ({"speeds": [], "refused_windows": []}, "footprints"),  # no fact at all
    ]
    for body, param in cases:
        response = client.post(
            "/v1/facts/import", json={"origin_box": ORIGIN, "sha256": sha256, **body}
        )
        assert _error(response, 400, "invalid_request")["param"] == param, body


def test_this_box_s_own_facts_on_a_place_decide_over_an_imported_refusal(
    box: tuple[TestClient, str, int],
) -> None:
    """Another box's refusal counts on a place until this box has a fact of its own there: a
    refusal, or a load (then a window the other box was refused at may be tried here)."""
    from fitbox.box.facts import Contract
    from fitbox.engines.seam import Held
    from fitbox.store.facts import ImportedWindow

    client, _, _ = box
    facts = client.app.state.box.facts  # type: ignore[attr-defined]
    (artifact,) = [
        a
        for a in client.app.state.box.catalog.artifacts()  # type: ignore[attr-defined]
        if a.name == "tiny"
    ]
    path, size, mtime_ns = artifact.identity()
    facts.window_imported(
        ImportedWindow((path, size, mtime_ns, "host", 256), "f16", "f16", None, 1.7e9, ORIGIN, 11)
    )
    facts.window_imported(
        ImportedWindow((path, size, mtime_ns, "gpu0", 256), "f16", "f16", None, 1.7e9, ORIGIN, 12)
    )
    assert facts.refusals(artifact) == {("host", 256): ORIGIN, ("gpu0", 256): ORIGIN}
    facts.window_refused(artifact, "host", Contract(512, 1), "out of memory", None)
    assert facts.refusals(artifact) == {("host", 512): None, ("gpu0", 256): ORIGIN}
    facts.footprint_measured(
        Held(1000, 100, 10, 1), artifact, "gpu0", Contract(128, 1), 0.5, None
    )  # a load here, below the other box's refused window
    assert facts.refusals(artifact) == {("host", 512): None}


def test_a_speed_this_box_measured_wins_over_an_imported_one_across_a_restart(
    tmp_path: Path,
) -> None:
    """Imported speeds price a file's rung until this box measures it; then its own do,
    however many imported ones come after (their recent windows are kept apart)."""
    from fitbox.box.speeds import SpeedBook
    from fitbox.models.catalog import Catalog
    from fitbox.store.db import MeasuredSpeed, Store

    models = tmp_path / "models"
    models.mkdir()
    write_tiny_llama(models / "tiny.gguf")
    (artifact,) = Catalog((models,), tmp_path / "aliases.toml").artifacts()
    identity = artifact.identity()

    def speed(decode_ms: float, origin: str | None, row: int | None) -> MeasuredSpeed:
        return MeasuredSpeed(
            *identity,
            "ram-only",
            "host",
            12,
            4.0,
            64,
            decode_ms,
            None,
            1.0,
            2,
            origin_box=origin,
            origin_id=row,
        )

    def reopened() -> tuple[Store, SpeedBook]:
        store = Store(tmp_path / "s.sqlite3")
        return store, SpeedBook(store)

    store, book = reopened()
    book.imported(speed(50.0, ORIGIN, 1))
    assert book.by_rung(artifact)["ram-only"].decode_ms == 50.0
    assert book.origins(artifact, "ram-only") == [ORIGIN]
    store.speed_measured(speed(10.0, None, None))
    store.close()
    store, book = reopened()  # read back from the store: the box's own, and the import
    for row in range(2, 30):  # more imported speeds than the recent window holds
        book.imported(speed(70.0, ORIGIN, row))
    store.close()
    store, book = reopened()
    try:
        measured = book.by_rung(artifact)["ram-only"]
        assert measured.decode_ms == 10.0 and measured.threads == ((2, 100.0),)
        assert book.origins(artifact, "ram-only") == []
    finally:
        store.close()
