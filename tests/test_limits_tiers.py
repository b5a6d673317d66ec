"""The central tier of a box's limits, in process (no engine): set with {"tier": "central"},
kept under the box tier, applied as the lower of the two, and each refusal named."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from fitbox import config

from .support.clients import app_client
from .support.ggufs import write_tiny_llama


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    models = tmp_path / "models"
    models.mkdir()
    write_tiny_llama(models / "tiny.gguf")
    cfg = config.load(
        {"home": str(tmp_path / "home"), "models": str(models)}, env={"FITBOX_SIMULATED_GPUS": ""}
    )
    with app_client(cfg) as test_client:
        yield test_client


def _ram(client: TestClient) -> dict[str, Any]:
    tiers: list[dict[str, Any]] = client.get("/v1/limits").json()["data"]
    return next(t for t in tiers if t["resource"] == "ram")


def _host_capacity(client: TestClient) -> int:
    plan = client.get("/v1/plan", params={"model": "tiny"}).json()
    return int(next(d["capacity_bytes"] for d in plan["box"] if d["device"] == "host"))


def test_the_central_tier_stays_under_the_box_tier_and_the_least_applies(
    client: TestClient,
) -> None:
    device = _ram(client)["device"]
    assert client.post("/v1/limits", json={"ram_max": device // 2}).status_code == 200
    taken = client.post("/v1/limits", json={"tier": "central", "ram_max": device // 4})
    assert taken.status_code == 200, taken.text
    ram = _ram(client)
    assert (ram["box"], ram["central"], ram["effective"]) == (device // 2, device // 4, device // 4)
    assert _host_capacity(client) <= device // 4  # placement sees the central tier
    above = client.post("/v1/limits", json={"tier": "central", "ram_max": device * 3 // 4})
    assert above.status_code == 400
    error = above.json()["error"]
    assert error["code"] == "above_parent_tier" and error["param"] == "ram_max"
    assert "the central setting" in error["message"] and "above the box setting" in error["message"]
    lowered = client.post("/v1/limits", json={"ram_max": device // 8})  # the box's own call
    assert lowered.status_code == 200 and _ram(client)["effective"] == device // 8
    assert client.post("/v1/limits", json={"ram_max": None}).status_code == 200
    assert _ram(client)["effective"] == device // 4  # the central tier still holds
    assert client.post("/v1/limits", json={"tier": "central", "ram_max": None}).status_code == 200
    assert _ram(client)["central"] is None and _ram(client)["effective"] == device


def test_a_tier_that_is_not_box_or_central_is_refused(client: TestClient) -> None:
    refused = client.post("/v1/limits", json={"tier": "global", "ram_max": "1GiB"})
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == "tier" and "box, central" in error["message"]
