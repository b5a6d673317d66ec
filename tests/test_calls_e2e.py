"""A call's row against a real fitbox and a real llama-server: a stream the client got whole
is recorded as finished whatever the client does next, and a call's row is in the store
file before the first byte of its response leaves (so a SIGKILL after it loses no row).

The moments are the test's own: the fronted fake (tests/fakes/fronted-llama-server)
withholds the end of the engine's body so the client leaves while fitbox still reads; the
store file is read the moment the response's status line has arrived.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path

import httpx
import pytest

from .support.processes import running_fitbox, start_fitbox, stop_fitbox

pytestmark = pytest.mark.engine
SMOL = "SmolLM2-135M-Instruct.Q4_1"
FRONTED = Path(__file__).parent / "fakes" / "fronted-llama-server"


def chat(**extra: object) -> dict[str, object]:
    return {"model": SMOL, "messages": [{"role": "user", "content": "Tell me a story."}], **extra}


def row_of(home: Path, request_id: str) -> dict[str, object] | None:
    """The call's row as committed in the store file now (what a SIGKILL would leave)."""
    with contextlib.closing(sqlite3.connect(home / "fitbox.sqlite3")) as conn:
        conn.row_factory = sqlite3.Row
        row = conn.execute("SELECT * FROM call_log WHERE request_id = ?", (request_id,))
        found = row.fetchone()
    return dict(found) if found is not None else None


def test_a_stream_the_client_got_whole_is_recorded_ok_whatever_the_client_does_next(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    """Every event and [DONE] reach the client, which then leaves; fitbox is still waiting
    for the end of the engine's body (withheld by the fake) when it learns so."""
    env = {
        "LLAMA_SERVER_BIN": str(FRONTED),
        "FAKE_REAL_BIN": str(llama_server_bin),
        "FAKE_HOLD_STREAM_END": "1",
    }
    with running_fitbox(tmp_path / "home", [smollm2.parent], env=env) as box:
        body = chat(
            max_tokens=8, stream=True, ignore_eos=True, stream_options={"include_usage": True}
        )
        events: list[str] = []
        with httpx.stream(
            "POST", f"{box.url}/v1/chat/completions", json=body, timeout=60
        ) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                if line == "data: [DONE]":
                    break  # the client has it all, and goes
        assert json.loads(events[-2])["usage"]["completion_tokens"] == 8
        row = box.calls()[-1]
        assert (row["outcome"], row["http_status"], row["completion_tokens"]) == ("ok", 200, 8)
        assert row["decode_ms"] is not None  # its timings were measured, too
        assert httpx.get(f"{box.url}/v1/residents").json()["data"][0]["calls"] == 0
        assert "never retrieved" not in box.log()


def test_a_call_row_is_in_the_store_before_the_first_byte_of_its_response(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    home = tmp_path / "home"
    box = start_fitbox(home, [smollm2.parent])
    try:
        warm = httpx.post(f"{box.url}/v1/chat/completions", json=chat(max_tokens=2), timeout=60)
        assert warm.status_code == 200, warm.text
        for n in range(4):
            for stream in (True, False):
                request_id = f"first-byte-{n}-{stream}"
                with httpx.stream(
                    "POST",
                    f"{box.url}/v1/chat/completions",
                    timeout=60,
                    json=chat(max_tokens=4, stream=stream),
                    headers={"x-request-id": request_id},
                ) as response:
                    # the status line is here: the response's first byte has left fitbox
                    assert row_of(home, request_id) is not None, f"{request_id}: no row yet"
                    response.read()
        # and the moment a stream's first byte is out, fitbox is killed (kill -9)
        body = chat(max_tokens=2000, stream=True, ignore_eos=True)
        with (
            pytest.raises(httpx.HTTPError),
            httpx.stream(
                "POST",
                f"{box.url}/v1/chat/completions",
                json=body,
                timeout=30,
                headers={"x-request-id": "killed"},
            ) as response,
        ):
            box.proc.kill()
            response.read()
        box.proc.wait(timeout=10)
    finally:
        stop_fitbox(box)
    with running_fitbox(home, [smollm2.parent]) as again:
        killed = [c for c in again.calls() if c["request_id"] == "killed"]
        assert [c["outcome"] for c in killed] == ["interrupted"]  # closed at start, not lost


def test_a_reply_the_client_got_whole_is_stored_ok_before_its_last_byte(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    """The end of a call is committed before its last byte leaves: read the moment the
    client has it all, the store file (what a SIGKILL then would leave) says ok."""
    with running_fitbox(tmp_path / "home", [smollm2.parent]) as box:
        for n in range(4):
            for stream in (True, False):
                request_id = f"last-byte-{n}-{stream}"
                reply = httpx.post(
                    f"{box.url}/v1/chat/completions",
                    timeout=60,
                    json=chat(max_tokens=4, stream=stream),
                    headers={"x-request-id": request_id},
                )
                assert reply.status_code == 200, reply.text
                row = row_of(box.home, request_id)
                assert row is not None and row["outcome"] == "ok", (request_id, row)


def test_a_stream_whose_client_asked_no_usage_is_counted_from_the_engine_s_own_figures(
    tmp_path: Path, smollm2: Path
) -> None:
    """Most chat UIs stream without ``stream_options.include_usage``: the engine's last
    chunk still carries its timings, and the row counts the tokens from them, as many as
    the engine's usage says when a client does ask."""
    with running_fitbox(tmp_path / "home", [smollm2.parent]) as box:
        rows = []
        for asks in ({}, {"stream_options": {"include_usage": True}}):
            body = chat(max_tokens=6, stream=True, ignore_eos=True, **asks)
            with httpx.stream(
                "POST", f"{box.url}/v1/chat/completions", json=body, timeout=60
            ) as response:
                events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
            rows.append(box.calls()[-1])
        usage = json.loads(events[-2])["usage"]  # the second stream's: the engine's count
        for row in rows:
            assert (row["outcome"], row["prompt_tokens"], row["completion_tokens"]) == (
                "ok",
                usage["prompt_tokens"],
                usage["completion_tokens"],
            )
        assert usage["completion_tokens"] == 6
