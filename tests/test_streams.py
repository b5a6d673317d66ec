"""server/streams/reshape.py: the one pass over a stream, per route shape, over every chunking
hypothesis finds: events cut across chunks, a ``<think>`` tag cut across them or never
closed, the asked model name put back, the figures' comment just before ``data: [DONE]``
(or last, on a stream that sends none), and whole replies."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from fitbox.server.streams import Reshape, Thinking
from fitbox.server.streams.events import DONE
from fitbox.server.streams.thinking import CHAT, COMPLETIONS, MESSAGES, RESPONSES

SERVED, ASKED = "Smol.Q4_1", "smollm2"
THINKS = ["<thi", "nk>h", "m</th", "ink>H", "i"]  # tags cut across pieces: thinking "hm", "Hi"
NEVER_CLOSES = ["<think>", "still ", "going"]
CUTS = st.lists(st.integers(0, 6000), max_size=10)
STAMPS = {"received_at": 1.0, "admitted_at": 1.25}
COMMENT = b": server-timing queue;dur=250.0, load;dur=0.0, total;dur=1000.0\n\n"


def _sse(data: dict[str, Any], named: bool) -> bytes:
    head = b"event: " + data["type"].encode() + b"\n" if named else b""
    return head + b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def _chat(words: list[str]) -> bytes:
    def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return {"id": "c1", "model": SERVED, "object": "chat.completion.chunk", "choices": [choice]}

    events = [chunk({"content": w}, None) for w in words] + [chunk({}, "stop")]
    return b"".join(_sse(e, False) for e in events) + DONE + b"\n\n"


def _completion(words: list[str]) -> bytes:
    def chunk(text: str, finish: str | None) -> dict[str, Any]:
        return {"model": SERVED, "choices": [{"index": 0, "text": text, "finish_reason": finish}]}

    events = [chunk(w, None) for w in words] + [chunk("", "stop")]
    return b"".join(_sse(e, False) for e in events) + DONE + b"\n\n"


def _responses(words: list[str]) -> bytes:
    item = {"type": "message", "id": "msg_1", "role": "assistant", "content": []}
    whole = "".join(words)
    done_item = {**item, "content": [{"type": "output_text", "text": whole}]}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": {"id": "resp_1", "model": SERVED}},
        {"type": "response.output_item.added", "item": item},
        {
            "type": "response.content_part.added",
            "item_id": "msg_1",
            "part": {"type": "output_text", "text": ""},
        },
        *({"type": "response.output_text.delta", "item_id": "msg_1", "delta": w} for w in words),
        {"type": "response.output_text.done", "item_id": "msg_1", "text": whole},
        {"type": "response.output_item.done", "item": done_item},
        {"type": "response.completed", "response": {"model": SERVED, "output": [done_item]}},
    ]
    return b"".join(_sse(e, True) for e in events)


def _messages(words: list[str]) -> bytes:  # no message_start: the engine left it out
    text_delta: Callable[[str], dict[str, Any]] = lambda w: {  # noqa: E731
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "text_delta", "text": w},
    }
    events: list[dict[str, Any]] = [
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        *(text_delta(w) for w in words),
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}},
        {"type": "message_stop"},
    ]
    return b"".join(_sse(e, True) for e in events)


def _run(path: str, stream: bytes, cuts: list[int]) -> tuple[bytes, list[str]]:
    """The stream cut at ``cuts`` through the pass; what came out, and what was closed or
    counted. Its end is stamped when the last piece arrives, as box/calls.py's relay does."""
    stamps: dict[str, float | None] = dict(STAMPS)
    seen: list[str] = []

    async def chunks() -> AsyncGenerator[bytes, None]:
        at = 0
        cut_at = sorted({c % (len(stream) + 1) for c in cuts} - {0, len(stream)})
        try:
            for cut in [*cut_at, len(stream)]:
                if cut == len(stream):
                    stamps["last_byte_at"] = 2.0
                yield stream[at:cut]
                at = cut
        finally:
            seen.append("closed")

    async def count() -> int | None:
        seen.append("counted")
        return 7

    async def main() -> bytes:
        target = Thinking(path, "reasoning_content")
        reshape = Reshape(path, SERVED, ASKED, target, 1, count, stamps)
        return b"".join([piece async for piece in reshape.stream(chunks())])

    return asyncio.run(main()), seen


def _data(out: bytes) -> list[dict[str, Any]]:
    events = []
    for event in out.split(b"\n\n"):
        lines = dict(line.split(b": ", 1) for line in event.split(b"\n") if b": " in line)
        if lines.get(b"data", b"").startswith(b"{"):
            data = json.loads(lines[b"data"])
            if b"event" in lines:
                assert lines[b"event"].decode() == data["type"]
            events.append(data)
    return events


def _models(out: bytes) -> set[str]:
    """Every ``model`` an event carries, at any depth."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("model"), str):
                found.add(node["model"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(_data(out))
    return found


@settings(max_examples=60)
@given(CUTS, st.sampled_from([THINKS, NEVER_CLOSES]))
def test_a_chat_stream(cuts: list[int], words: list[str]) -> None:
    out, seen = _run(CHAT, _chat(words), cuts)
    deltas = [e["choices"][0]["delta"] for e in _data(out)]
    assert deltas[0] == {"role": "assistant", "content": None}  # its opening, made
    thought = "".join(d.get("reasoning_content", "") for d in deltas)
    text = "".join(d.get("content") or "" for d in deltas)
    expected = ("hm", "Hi") if words == THINKS else ("still going", "")
    assert (thought, text) == expected
    assert _models(out) == {ASKED}
    assert out.endswith(b"\n\n" + COMMENT + DONE + b"\n\n") and out.count(b"server-timing") == 1
    assert seen == ["closed"]  # nothing counted: chat's opening carries no tokens


@settings(max_examples=60)
@given(CUTS, st.sampled_from([THINKS, NEVER_CLOSES]))
def test_a_text_completion_stream(cuts: list[int], words: list[str]) -> None:
    out, _ = _run(COMPLETIONS, _completion(words), cuts)
    choices = [e["choices"][0] for e in _data(out)]
    thought = "".join(c.get("reasoning_content", "") for c in choices)
    expected = ("hm", "Hi") if words == THINKS else ("still going", "")
    assert (thought, "".join(c["text"] for c in choices)) == expected
    assert _models(out) == {ASKED}
    assert out.endswith(b"\n\n" + COMMENT + DONE + b"\n\n") and out.count(b"server-timing") == 1


@settings(max_examples=60)
@given(CUTS, st.sampled_from([THINKS, NEVER_CLOSES]))
def test_a_responses_stream(cuts: list[int], words: list[str]) -> None:
    out, _ = _run(RESPONSES, _responses(words), cuts)
    events = _data(out)
    kinds = [e["type"] for e in events]
    thought = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    expected = ("hm", "Hi") if words == THINKS else ("still going", "")
    assert (thought, text) == expected
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = events[-1]["response"]["output"]
    assert [i["type"] for i in final] == ["reasoning", "message"]
    assert _models(out) == {ASKED}
    assert out.endswith(b"\n\n" + COMMENT)  # no [DONE] here: the figures come last


@settings(max_examples=60)
@given(CUTS, st.sampled_from([THINKS, NEVER_CLOSES]))
def test_a_messages_stream(cuts: list[int], words: list[str]) -> None:
    out, seen = _run(MESSAGES, _messages(words), cuts)
    events = _data(out)
    assert events[0]["type"] == "message_start"  # made: the engine left it out
    assert events[0]["message"]["model"] == ASKED
    assert events[0]["message"]["usage"]["input_tokens"] == 7
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    thought = "".join(d.get("thinking", "") for d in deltas)
    text = "".join(d.get("text", "") for d in deltas)
    expected = ("hm", "Hi") if words == THINKS else ("still going", "")
    assert (thought, text) == expected
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert starts == (["thinking", "text"] if words == THINKS else ["thinking"])
    assert out.endswith(b"\n\n" + COMMENT) and out.count(b"server-timing") == 1
    assert sorted(seen) == ["closed", "counted"]


def test_a_chunk_that_needs_no_change_goes_on_as_it_came() -> None:
    """The fast path: once a chat stream has opened, its plain chunks are not rebuilt (the
    same bytes, spaces and all, where parsing and writing them again would drop them)."""
    opened = b'data: {"choices": [{"index": 0, "delta": {"role": "assistant"}}]}\n\n'
    plain = b'data: {"choices": [{"index": 0, "delta": {"content": "a b"}}]}\n\n'
    out, _ = _run(CHAT, opened + plain + DONE + b"\n\n", [len(opened), len(opened + plain)])
    assert out == opened + plain + COMMENT + DONE + b"\n\n"


def test_a_whole_reply_gets_its_thinking_split_and_the_asked_name() -> None:
    reply = {
        "model": SERVED,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "<think>hm"}}],
    }
    reshape = Reshape(CHAT, SERVED, ASKED, Thinking(CHAT, "reasoning"))
    body = json.loads(reshape.whole(json.dumps(reply).encode()))
    assert body["model"] == ASKED
    assert body["choices"][0]["message"] == {"role": "assistant", "reasoning": "hm", "content": ""}
    plain = json.dumps({"model": ASKED, "choices": []}).encode()
    assert Reshape(CHAT, ASKED, ASKED, None).whole(plain) is plain  # nothing to do: untouched


def test_the_package_is_pure_bytes_in_bytes_out() -> None:
    """server/streams/ imports nothing of fitbox's but itself, and no HTTP framework: it is
    testable without a Box."""
    import ast
    from pathlib import Path

    import fitbox.server.streams as package

    for source in Path(package.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                assert not name.startswith("starlette"), (source.name, name)
                if name.startswith("fitbox"):
                    assert name.startswith("fitbox.server.streams"), (source.name, name)


def test_one_event_a_chunk_takes_the_fast_paths_and_gives_the_same_reply() -> None:
    """Each event in a chunk of its own (as llama-server writes them): the chunks a stage
    passes skip it, and what comes out is what one chunk of it all gives."""
    for path, make in ((CHAT, _chat), (COMPLETIONS, _completion), (MESSAGES, _messages)):
        for words in (THINKS, NEVER_CLOSES, ["plain ", "text"]):
            stream = make(words)
            bounds = [at + 2 for at in range(len(stream)) if stream.startswith(b"\n\n", at)]
            each, _ = _run(path, stream, bounds)
            whole, _ = _run(path, stream, [])
            strip = [{k: v for k, v in e.items() if k != "message"} for e in _data(each)]
            assert strip == [{k: v for k, v in e.items() if k != "message"} for e in _data(whole)]
            assert each.endswith(COMMENT + DONE + b"\n\n" if path != MESSAGES else COMMENT)
