"""A write lock on the store held outside fitbox (an operator's ``sqlite3`` inside a
transaction) against a real fitbox and a real llama-server: the event loop never waits on
it. ``/health`` answers and names the lock, calls are served, reads go on (WAL: a reader
never waits for a writer), a change answers 503 ``store_busy`` with ``Retry-After`` and is
not made; once the lock goes, changes land and the calls made meanwhile have their rows.

No time is asserted: a request that froze the loop shows as a client that times out
(``LOOP_FROZEN_S``, under SQLite's 5 s busy timeout, which a frozen loop waits out).
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from .support.clients import assert_error
from .support.processes import running_fitbox

pytestmark = pytest.mark.engine
SMOL = "SmolLM2-135M-Instruct.Q4_1"
LOOP_FROZEN_S = 4.0  # a client waiting this long on /health met a frozen loop
CALL_S = 120.0  # a failure bound for a chat call (its model loads first)


def health_meanwhile(url: str, send: Callable[[], httpx.Response]) -> httpx.Response:
    """``send()``'s response, with /health asked over and over while it is in flight: each
    must answer (a loop frozen by ``send`` times one out)."""
    with ThreadPoolExecutor(1) as pool, httpx.Client(timeout=LOOP_FROZEN_S) as client:
        pending = pool.submit(send)
        while not pending.done():
            assert client.get(f"{url}/health").status_code == 200
        return pending.result()


def test_a_write_lock_held_outside_never_freezes_the_box(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    home = tmp_path / "home"
    with running_fitbox(home, [smollm2.parent]) as box, httpx.Client(base_url=box.url) as client:
        before = client.post("/v1/keys", json={"name": "before", "scopes": ["read"]})
        assert before.status_code == 201, before.text
        lock = sqlite3.connect(home / "fitbox.sqlite3", isolation_level=None)
        try:
            lock.execute("BEGIN EXCLUSIVE")
            health = client.get("/health", timeout=LOOP_FROZEN_S).json()
            assert health["status"] == "degraded"
            assert any("locked by another connection" in p for p in health["problems"])

            refused = health_meanwhile(
                box.url,
                lambda: httpx.post(f"{box.url}/v1/keys", json={"name": "refused"}, timeout=CALL_S),
            )
            assert_error(refused, 503, "store_busy")
            assert int(refused.headers["retry-after"]) >= 1
            assert refused.headers["x-should-retry"] == "true"

            listed = client.get("/v1/keys", timeout=LOOP_FROZEN_S)
            assert listed.status_code == 200
            assert "before" in [k["name"] for k in listed.json()["data"]]

            setting = health_meanwhile(
                box.url,
                lambda: httpx.post(
                    f"{box.url}/v1/settings/box", json={"goal": "fast"}, timeout=CALL_S
                ),
            )
            assert_error(setting, 503, "store_busy")

            reply = health_meanwhile(
                box.url,
                lambda: httpx.post(
                    f"{box.url}/v1/chat/completions",
                    json={
                        "model": SMOL,
                        "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 4,
                    },
                    headers={"x-request-id": "under-the-lock"},
                    timeout=CALL_S,
                ),
            )
            assert reply.status_code == 200, reply.text
            assert reply.json()["choices"]
        finally:
            with contextlib.suppress(sqlite3.Error):
                lock.execute("ROLLBACK")
            lock.close()

        after = client.post("/v1/keys", json={"name": "after", "scopes": ["read"]}, timeout=30)
        assert after.status_code == 201, after.text
        got = client.get("/v1/keys", timeout=30)
        assert got.status_code == 200, got.text
        names = [k["name"] for k in got.json()["data"]]
        assert "before" in names and "after" in names and "refused" not in names
        assert "goal" not in client.get("/v1/settings/box", timeout=30).json()["own"]
        deadline = time.monotonic() + CALL_S  # a failure bound: kept rows retry each second
        while (problems := client.get("/health", timeout=30).json()["problems"]) != []:
            assert time.monotonic() < deadline, problems
        rows = [c for c in box.calls(settle=30) if c["request_id"] == "under-the-lock"]
        assert [(r["outcome"], r["http_status"]) for r in rows] == [("ok", 200)]
