"""A real box serving a real model while its store file is overwritten or deleted: /health
and inference answer throughout, the store says what happened, the box key still opens
every door, and every call after the fault has its row."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from fitbox import config

from .support.clients import app_client
from .support.holds import until
from .support.store_faults import checkpointed, delete_store, overwrite_pages

pytestmark = pytest.mark.engine
OUTSIDE = ("203.0.113.5", 5000)  # a peer that needs a key for everything


def _chat(client: TestClient, key: str) -> Any:
    return client.post(
        "/v1/chat/completions",
        json={"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        headers={"Authorization": f"Bearer {key}"},
    )


def _noticed(client: TestClient) -> dict[str, Any] | None:
    health: dict[str, Any] = client.get("/health").json()
    return health if health["store"]["file_problem"] else None


def _ok_rows_since(path: Path, since: float) -> int:
    with sqlite3.connect(path) as conn:
        return int(
            conn.execute(
                "SELECT COUNT(*) FROM call_log WHERE outcome = 'ok' AND received_at >= ?",
                (since,),
            ).fetchone()[0]
        )


@pytest.mark.parametrize("fault", ["overwritten", "deleted"])
def test_a_store_file_lost_under_a_serving_box(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path, fault: str
) -> None:
    cfg = config.load({"home": str(tmp_path), "models": str(smollm2.parent)}, env={})
    with app_client(cfg, OUTSIDE) as client:
        box_key = cfg.box_key_file.read_text().strip()
        auth = {"Authorization": f"Bearer {box_key}"}
        earlier = client.post("/v1/keys", json={"name": "earlier"}, headers=auth).json()["key"]
        assert _chat(client, box_key).status_code == 200
        client.app.state.store.flush()  # type: ignore[attr-defined]
        if fault == "overwritten":
            checkpointed(cfg.store_path)
            overwrite_pages(cfg.store_path, 1, 3)  # the header and the pages after it
        else:
            delete_store(cfg.store_path)
        fault_at = time.time()
        assert client.get("/health").status_code == 200  # answers while the fault is fresh
        assert _chat(client, box_key).status_code == 200
        health = until(lambda: _noticed(client), "the store noticed its file")
        assert health["status"] == "degraded"
        assert any(fault in problem for problem in health["problems"])
        after = _chat(client, box_key)
        assert after.status_code == 200 and after.json()["choices"]
        assert client.get("/v1/keys", headers=auth).status_code == 200
        calls = client.get("/v1/telemetry", params={"table": "call_log"}, headers=auth)
        assert calls.status_code == 200 and calls.json()["rows"]
        assert client.get("/metrics", headers=auth).status_code == 200
        assert fault in client.get("/", headers=auth).text  # the dashboard says it too
        if fault == "deleted":  # every row was still there to copy: keys made before too
            assert _chat(client, earlier).status_code == 200
    assert _ok_rows_since(cfg.store_path, fault_at) >= 2  # the call during the fault, and after
