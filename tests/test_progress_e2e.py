"""Loading progress, seen by the openai SDK's own stream iterator, on a real cold load of
SmolLM2 held by the gated fake's load gate (its /health says "Loading model" until the test
opens the gate), and a load that fails after the 200, seen as an error event."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageParam

from .support.clients import openai_client
from .support.holds import GATED, HOLD_IDLE_TIMEOUT, calls_on, until
from .support.processes import FitboxProcess, running_fitbox

pytestmark = pytest.mark.engine
SMOL = "SmolLM2-135M-Instruct.Q4_1"
HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gate") / "load-gate"


@pytest.fixture(scope="module")
def box(
    tmp_path_factory: pytest.TempPathFactory, smollm2: Path, llama_server_bin: Path, gate: Path
) -> Iterator[FitboxProcess]:
    env = {
        "LLAMA_SERVER_BIN": str(GATED),
        "FAKE_REAL_LLAMA_SERVER": str(llama_server_bin),
        "FAKE_LOAD_GATE": str(gate),
        **HOLD_IDLE_TIMEOUT,
    }
    with running_fitbox(tmp_path_factory.mktemp("home"), [smollm2.parent], env=env) as running:
        yield running


def _client(box: FitboxProcess, key: str = "unused") -> openai.OpenAI:
    return openai_client(box.url, api_key=key, max_retries=0)


def _progress_chunks(client: openai.OpenAI, opt_in: bool = True) -> Iterator[ChatCompletionChunk]:
    """A cold stream as the SDK iterates it; create() returns with the status line, so the
    200 came while the load is held. ``opt_in``: asked for progress in the call's metadata."""
    metadata = {"fitbox_progress": "true"} if opt_in else openai.omit
    stream = client.chat.completions.create(
        model=SMOL, messages=HELLO, max_tokens=4, stream=True, metadata=metadata
    )
    return iter(stream)


@contextlib.contextmanager
def _raw_lines(
    box: FitboxProcess, body: dict[str, Any]
) -> Iterator[tuple[httpx.Response, Iterator[str]]]:
    """A cold stream's lines as they come, its 200 and its first keep-alive already seen
    (both before the load is done); closed when the block ends."""
    with httpx.stream("POST", f"{box.url}/v1/chat/completions", json=body, timeout=120) as reply:
        assert reply.status_code == 200
        lines = reply.iter_lines()
        assert next(lines) == ": fitbox: loading the model"
        yield reply, lines


def _unloaded(box: FitboxProcess) -> None:
    httpx.post(f"{box.url}/v1/operator/unload", json={"model": SMOL}, timeout=60)
    until(lambda: box.models()[SMOL]["state"] in ("unloaded", "failed"), "the model is out")


def test_a_cold_stream_shows_progress_then_the_reply(
    box: FitboxProcess, gate: Path, smollm2: Path
) -> None:
    gate.unlink(missing_ok=True)
    with _client(box) as client:
        chunks = _progress_chunks(client)
        seen = []
        for chunk in chunks:  # the load is held: only progress comes, however long this takes
            assert chunk.choices == []
            extra = chunk.model_extra or {}
            seen.append(extra["fitbox_progress"])
            if seen[-1]["bytes_total"] and seen[-1]["bytes_loaded"]:
                break
        progress = seen[-1]
        assert progress["state"] == "loading" and progress["queue_position"] is None
        assert 0 < progress["bytes_loaded"] <= progress["bytes_total"]
        assert progress["bytes_total"] <= smollm2.stat().st_size
        assert progress["seconds"] >= seen[0]["seconds"] >= 0
        gate.touch()  # the load completes
        text = ""
        for chunk in chunks:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
        assert text
    row = box.calls()[-1]
    assert row["outcome"] == "ok" and row["load_ready_at"] > row["load_start_at"]


def test_without_opting_in_a_cold_stream_gets_keep_alives_only(
    box: FitboxProcess, gate: Path
) -> None:
    _unloaded(box)
    gate.unlink(missing_ok=True)
    body = {"model": SMOL, "messages": HELLO, "max_tokens": 4, "stream": True}
    with _raw_lines(box, body) as (reply, lines):
        gate.touch()
        rest = [line for line in lines if line]
    assert "fitbox_progress" not in "".join(rest)
    assert rest[-1] == "data: [DONE]" and rest[-2].startswith(": server-timing ")
    # nothing was known when the 200 left; the comment before [DONE] has the load's time
    assert "server-timing" not in reply.headers
    figures = dict(part.strip().split(";dur=") for part in rest[-2][16:].split(","))
    assert list(figures) == ["queue", "load", "ttft", "total"] and float(figures["load"]) > 0


def test_a_load_that_fails_after_the_200_ends_in_an_error_event(
    box: FitboxProcess, gate: Path
) -> None:
    _unloaded(box)
    gate.unlink(missing_ok=True)
    failing = Path(f"{gate}.fail")
    try:
        with _client(box) as client:
            chunks = _progress_chunks(client)
            first = next(chunks)  # the 200 and a first progress line came
            assert (first.model_extra or {})["fitbox_progress"]["state"] in ("queued", "loading")
            failing.touch()  # the engine dies halfway through its load
            with pytest.raises(openai.APIError) as raised:
                for _chunk in chunks:
                    pass
        assert "exited" in raised.value.message or "failed" in raised.value.message
        body = raised.value.body
        assert isinstance(body, dict) and body["code"] in ("engine_failed", "model_failed")
    finally:
        failing.unlink(missing_ok=True)
    row = box.calls()[-1]
    assert row["outcome"] == "error" and row["http_status"] >= 500


def test_progress_is_a_key_setting_too(box: FitboxProcess, gate: Path) -> None:
    made = httpx.post(
        f"{box.url}/v1/keys", json={"name": "progress", "scopes": ["inference"]}, timeout=30
    ).json()
    opted = httpx.post(
        f"{box.url}/v1/settings/key", json={"key": made["id"], "progress": True}, timeout=30
    )
    assert opted.json()["effective"] == {"reasoning_field": "reasoning_content", "progress": True}
    _unloaded(box)
    gate.unlink(missing_ok=True)
    with _client(box, made["key"]) as client:
        chunks = _progress_chunks(client, opt_in=False)  # no metadata: the key opted in
        first = next(chunks)
        assert first.choices == [] and "fitbox_progress" in (first.model_extra or {})
        gate.touch()
        assert any(c.choices for c in chunks)


def test_a_client_that_leaves_during_the_load_is_recorded_and_holds_nothing(
    box: FitboxProcess, gate: Path
) -> None:
    _unloaded(box)
    gate.unlink(missing_ok=True)
    body = {
        "model": SMOL,
        "messages": HELLO,
        "max_tokens": 4,
        "stream": True,
        "metadata": {"fitbox_progress": "true"},
        "user": "leaves",
    }
    with _raw_lines(box, body):
        pass  # the 200 and the first keep-alive came: the client leaves
    # the client is gone; the load goes on
    row = until(
        lambda: next((r for r in box.calls() if r["outcome"] == "interrupted"), None),
        "the call that left is recorded",
    )
    assert row["stream"] == 1
    gate.touch()
    until(lambda: box.models()[SMOL]["state"] == "ready", "the load completes")
    assert calls_on(box, SMOL) == 0  # no lease left behind
