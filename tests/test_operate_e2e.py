"""Operator actions on a real fitbox: load, pin against eviction, unpin, unload (never a
model that is serving), refresh; every action recorded; /openapi.json and /v1/storage."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import httpx
import pytest

from .support.ggufs import two_models_one_at_a_time
from .support.holds import (
    HOLD_IDLE_TIMEOUT,
    SAFETY_S,
    Background,
    calls_on,
    engine_stopped,
    until,
)
from .support.processes import running_fitbox

pytestmark = pytest.mark.engine
SMOL = "SmolLM2-135M-Instruct.Q4_1"


def act(url: str, action: str, model: str | None = None) -> httpx.Response:
    body = {"model": model} if model else None
    return httpx.post(f"{url}/v1/operator/{action}", json=body, timeout=SAFETY_S)


def test_operator_actions_keep_their_promises(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    root = tmp_path / "models"
    cap = two_models_one_at_a_time(root, smollm2)
    with running_fitbox(
        tmp_path / "home", [root], "--ram-max", str(cap), env=HOLD_IDLE_TIMEOUT
    ) as box:
        assert act(box.url, "pin", "tiny").json()["resident"]["pinned"] is True
        held = httpx.post(
            f"{box.url}/v1/completions",
            timeout=SAFETY_S,
            json={"model": SMOL, "prompt": "hi", "max_tokens": 1},
        )
        assert held.status_code == 507 and held.json()["error"]["code"] == "held_by_pinned"
        assert act(box.url, "unpin", "tiny").status_code == 200
        assert act(box.url, "load", SMOL).json()["resident"]["model"] == SMOL  # evicts tiny
        residents = httpx.get(f"{box.url}/v1/residents").json()["data"]
        assert [r["model"] for r in residents] == [SMOL]

        def stream() -> list[str]:
            body = {
                "model": SMOL,
                "prompt": "Tell a story",
                "max_tokens": 8,  # held by the stopped engine, not by its length
                "stream": True,
                "ignore_eos": True,
            }
            url = f"{box.url}/v1/completions"
            with httpx.stream("POST", url, json=body, timeout=SAFETY_S) as r:
                return list(r.iter_lines())

        # the stream's engine is stopped: the call is on the resident until the test lets it
        # go, however fast the machine generates
        with engine_stopped(box, SMOL):
            streaming = Background(stream)
            until(lambda: calls_on(box, SMOL) == 1, "the stream's call on the resident")
            busy = act(box.url, "unload", SMOL)
        lines = streaming.result()
        assert busy.status_code == 409 and "never stopped while serving" in busy.text
        assert "data: [DONE]" in lines  # the stream it refused to stop finished
        assert act(box.url, "unload", SMOL).status_code == 200
        assert httpx.get(f"{box.url}/v1/residents").json()["data"] == []
        assert act(box.url, "refresh-models").json()["models"] == 2
        assert act(box.url, "reboot", SMOL).status_code == 404

        spec = httpx.get(f"{box.url}/openapi.json").json()
        assert "/v1/operator/{action}" in spec["paths"] and spec["openapi"].startswith("3.")
        drives = httpx.get(f"{box.url}/v1/storage").json()["data"]
        assert {m["model"] for d in drives for m in d["models"]} == {SMOL, "tiny"}
    with sqlite3.connect(tmp_path / "home" / "fitbox.sqlite3") as conn:
        rows = conn.execute("SELECT action, target, outcome FROM operator_actions ORDER BY id")
        assert list(rows) == [
            ("pin", "tiny", "ok"),
            ("unpin", "tiny", "ok"),
            ("load", SMOL, "ok"),
            ("unload", SMOL, "error"),
            ("unload", SMOL, "ok"),
            ("refresh-models", None, "ok"),
        ]
