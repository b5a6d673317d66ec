"""The store failing under a real call: the client still gets its answer."""

from __future__ import annotations

from pathlib import Path

import pytest

from fitbox import config

from .support.clients import app_client

pytestmark = pytest.mark.engine


def test_a_full_disk_never_costs_the_client_its_answer(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    cfg = config.load({"home": str(tmp_path), "models": str(smollm2.parent)}, env={})
    with app_client(cfg) as client:
        store = client.app.state.store  # type: ignore[attr-defined]
        store._submit(
            lambda conn: conn.execute(
                "PRAGMA max_page_count = " + str(conn.execute("PRAGMA page_count").fetchone()[0])
            ),
            wait=True,
        ).result()
        for i in range(60):  # rows that no longer fit: unknown models answer at once
            missing = client.post(
                "/v1/completions", json={"model": f"{i}-" + "x" * 400, "prompt": "hi"}
            )
            assert missing.status_code == 404
        store.flush()
        assert store.write_failures > 0
        for _ in range(2):
            reply = client.post(
                "/v1/chat/completions",
                json={
                    "model": "smollm2",
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 2,
                },
            )
            assert reply.status_code == 200 and reply.json()["choices"]
        store.flush()
        health = client.get("/health").json()
        # writes failing is never "ok" (issue 20): the box serves on and says why
        assert health["status"] == "degraded" and health["store"]["write_failures"] > 0
        assert any("cannot write" in problem for problem in health["problems"])
