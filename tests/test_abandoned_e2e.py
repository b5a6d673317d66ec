"""A whole call whose client leaves stops (issue #35): the client closes its connection
after the engine has made some tokens of a long answer (the engine frozen meanwhile, so
fitbox sees the client go before the engine could finish); fitbox closes the engine's
connection, llama-server stops generating for it (its own token count and /slots say so),
the next call is served at once, and the call's row says abandoned."""

from __future__ import annotations

import contextlib
import json
import socket
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from .support.holds import engine_stopped, until
from .support.processes import running_fitbox

pytestmark = pytest.mark.engine
SMOL = "SmolLM2-135M-Instruct.Q4_1"


def _slots(engine: str) -> list[dict[str, Any]]:
    """The engine's own slots, asked of the child itself (through fitbox, /slots would wait
    for a slot like any call)."""
    found: list[dict[str, Any]] = httpx.get(f"{engine}/slots", timeout=30).json()
    return found


def _decoded(slot: dict[str, Any]) -> int:
    token = slot.get("next_token")
    token = token[0] if isinstance(token, list) else token
    return int((token or {}).get("n_decoded", 0))


def _predicted(engine: str) -> int:
    """Tokens the engine has generated since it started (its own llamacpp:* counter)."""
    text = httpx.get(f"{engine}/metrics", timeout=30).text
    line = next(ln for ln in text.splitlines() if ln.startswith("llamacpp:tokens_predicted_total"))
    return int(float(line.split()[-1]))


def _outcome(home: Path, call_id: int) -> str | None:
    with contextlib.closing(sqlite3.connect(home / "fitbox.sqlite3")) as conn:
        row = conn.execute("SELECT outcome FROM call_log WHERE id = ?", (call_id,)).fetchone()
    return str(row[0]) if row else None


def _idle_after_a_pause(engine: str) -> bool:
    """Asked every 2 s, no more: llama-server looks at a whole call's connection only when
    a second has passed with no result for any of its tasks (server_response's
    recv_with_timeout waits again from the start at each one), and each /slots answer is
    such a result: asked more often, the look never comes."""
    time.sleep(2)
    return _busy(engine) is None


def _busy(url: str) -> dict[str, Any] | None:
    return next((s for s in _slots(url) if s.get("is_processing")), None)


def test_a_whole_call_whose_client_left_stops_on_the_engine(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    with running_fitbox(tmp_path / "home", [smollm2.parent], env={"FITBOX_PARALLEL": "1"}) as box:
        warm = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}
        first = {**warm, "max_tokens": 1}
        assert httpx.post(f"{box.url}/v1/chat/completions", json=first, timeout=120).is_success
        long = json.dumps(
            {**warm, "max_tokens": 2000, "ignore_eos": True, "temperature": 0}
        ).encode()
        (child,) = httpx.get(f"{box.url}/v1/residents").json()["data"]
        engine = f"http://127.0.0.1:{child['port']}"
        host, port = httpx.URL(box.url).host, httpx.URL(box.url).port
        before = _predicted(engine)
        client = socket.create_connection((host, port or 80))
        client.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (f"{host}:{port}".encode(), len(long), long)
        )
        until(lambda: ((s := _busy(engine)) and _decoded(s) >= 10) or None, "10 tokens made")
        with engine_stopped(box, SMOL):  # held while the client leaves and fitbox sees it
            client.close()  # the client gives up
            until(lambda: _outcome(box.home, 2) == "abandoned" or None, "the row abandoned")
        # woken, the engine finds its connection closed at its next look (llama-server looks
        # about once a second) and stops, far short of the 2,000 tokens asked
        until(lambda: _idle_after_a_pause(engine), "the engine stopped")
        made = _predicted(engine) - before  # the engine's own count, after the stop
        assert 10 <= made < 2000, made
        assert _predicted(engine) - before == made  # and it stayed stopped
        answered = httpx.post(
            f"{box.url}/v1/chat/completions", json={**warm, "max_tokens": 2}, timeout=60
        )
        assert answered.status_code == 200
        rows = box.calls()
        abandoned = [r for r in rows if r["outcome"] == "abandoned"]
        assert len(abandoned) == 1 and abandoned[0]["http_status"] == 499, rows
        assert [r["outcome"] for r in rows].count("ok") == 2
