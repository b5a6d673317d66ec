"""The openings of server/streams/ (choices.py, responses.py, messages.py), through the one
pass (reshape.py): a stream's opening put back or kept once, whatever the chunking."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from fitbox.server.streams import Reshape, messages
from fitbox.server.streams.thinking import CHAT, MESSAGES, RESPONSES


def _sse(data: dict[str, Any], name: str | None = None) -> bytes:
    head = f"event: {name}\n".encode() if name else b""
    return head + b"data: " + json.dumps(data).encode() + b"\n\n"


def _run(
    stream: bytes, cuts: list[int], path: str, choices: int = 1, counted: int | None = 7
) -> tuple[bytes, list[str]]:
    """The stream cut at ``cuts`` through the pass (its thinking left as it is); what came
    out and what was closed."""
    closed: list[str] = []
    asked: list[str] = []

    async def chunks() -> AsyncGenerator[bytes, None]:
        try:
            at = 0
            for cut in [*sorted({c % (len(stream) + 1) for c in cuts}), len(stream)]:
                if cut > at:
                    yield stream[at:cut]
                    at = cut
        finally:
            closed.append("engine")

    async def count() -> int | None:
        asked.append("count")
        return counted

    async def main() -> bytes:
        out = Reshape(path, "served", "served", None, choices, count).stream(chunks())
        return b"".join([piece async for piece in out])

    return asyncio.run(main()), closed + asked


def _data(out: bytes) -> list[dict[str, Any]]:
    return [json.loads(ln[6:]) for ln in out.decode().splitlines() if ln.startswith("data: {")]


BLOCK = _sse(
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    "content_block_start",
)
STOP = _sse({"type": "message_stop"}, "message_stop")


@given(st.lists(st.integers(min_value=0, max_value=400), max_size=6))
def test_a_messages_stream_without_its_start_gets_one_first(cuts: list[int]) -> None:
    out, seen = _run(BLOCK + STOP, cuts, MESSAGES)
    events = _data(out)
    assert [e["type"] for e in events] == ["message_start", "content_block_start", "message_stop"]
    message = events[0]["message"]
    assert message["model"] == "served" and message["usage"] == {
        "input_tokens": 7,
        "output_tokens": 0,
    }
    assert message["id"].startswith("msg_") and out.endswith(BLOCK + STOP)
    assert sorted(seen) == ["count", "engine"]  # counted once, and the engine closed


def test_a_messages_stream_with_its_start_is_left_as_it_came_and_counts_nothing() -> None:
    start = messages.message_start("served", 3)
    out, seen = _run(start + BLOCK + STOP, [5, 90], MESSAGES)
    assert out == start + BLOCK + STOP and seen == ["engine"]


def test_an_engine_that_cannot_count_gives_zero_input_tokens() -> None:
    out, _ = _run(BLOCK, [], MESSAGES, counted=None)
    assert _data(out)[0]["message"]["usage"]["input_tokens"] == 0


def _chunk(index: int, delta: dict[str, Any], **extra: Any) -> bytes:
    return _sse(
        {
            "id": "c1",
            "model": "served",
            "object": "chat.completion.chunk",
            **extra,
            "choices": [{"index": index, "delta": delta, "finish_reason": None}],
        }
    )


@given(st.lists(st.integers(min_value=0, max_value=600), max_size=6))
def test_each_chat_choice_opens_with_its_role_once(cuts: list[int]) -> None:
    stream = (
        _chunk(0, {"content": "🌳"})
        + _chunk(1, {"role": "assistant", "content": None})
        + _chunk(1, {"content": "x"})
        + _chunk(0, {"content": "y"})
        + b"data: [DONE]\n\n"
    )
    out, _ = _run(stream, cuts, CHAT, choices=2)
    deltas = [(e["choices"][0]["index"], e["choices"][0]["delta"]) for e in _data(out)]
    role = {"role": "assistant", "content": None}
    assert deltas == [
        (0, role),
        (0, {"content": "🌳"}),
        (1, role),
        (1, {"content": "x"}),
        (0, {"content": "y"}),
    ]
    assert out.endswith(b"data: [DONE]\n\n")


def test_a_made_role_chunk_carries_no_figures() -> None:
    out, _ = _run(_chunk(0, {"content": "a"}, timings={"predicted_n": 1}), [], CHAT)
    first = _data(out)[0]
    assert "timings" not in first and first["id"] == "c1" and first["model"] == "served"


@given(st.lists(st.integers(min_value=0, max_value=900), max_size=8))
def test_a_responses_stream_says_created_and_in_progress_once(cuts: list[int]) -> None:
    created = _sse({"type": "response.created"}, "response.created")
    progress = _sse({"type": "response.in_progress"}, "response.in_progress")
    delta = _sse({"type": "response.output_text.delta", "delta": "a"}, "response.output_text.delta")
    done = _sse({"type": "response.completed"}, "response.completed")
    out, _ = _run(created + progress + delta + created + progress + delta + done, cuts, RESPONSES)
    assert out == created + progress + delta + delta + done


def test_other_routes_pass_untouched() -> None:
    stream = b'data: {"choices":[{"text":"\\u00e9"}]}\n\n'
    assert _run(stream, [3], "/v1/completions")[0] == stream
