"""server/streams/thinking.py and the pass's shapers (reshape.py) in process: text completions,
Responses and Messages streams, shaped as llama-server writes them, over every chunking
hypothesis finds, carry the thinking and the text that splitting the whole text gives."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from fitbox.server.streams.reshape import Pass, stages_for
from fitbox.server.streams.thinking import COMPLETIONS, MESSAGES, RESPONSES, Thinking, split
from fitbox.server.streams.thinking import whole as whole_reply

PIECES = st.lists(
    st.sampled_from(
        ["<think>", "</think>", "<", "</", "<th", "think>", "k>", "a", "b c", "\n", "é", ">"]
    ),
    min_size=1,
    max_size=12,
)
CUTS = st.lists(st.integers(0, 4000), max_size=12)


def _event(data: dict[str, Any], named: bool) -> bytes:
    name = b"event: " + data["type"].encode() + b"\n" if named else b""
    return name + b"data: " + json.dumps(data).encode() + b"\n\n"


def _run(path: str, raw: bytes, cuts: list[int]) -> list[dict[str, Any]]:
    shaper, out, at = Pass(stages_for(path, Thinking(path, "reasoning_content"))), b"", 0
    for cut in [*sorted({min(c, len(raw)) for c in cuts}), len(raw)]:
        out += shaper.feed(raw[at:cut])
        at = cut
    out += shaper.finish()
    events = []
    for event in out.split(b"\n\n"):
        lines = dict(line.split(b": ", 1) for line in event.split(b"\n") if b": " in line)
        if lines.get(b"data", b"").startswith(b"{"):
            data = json.loads(lines[b"data"])
            if path != COMPLETIONS:
                assert lines[b"event"].decode() == data["type"]
            events.append(data)
    return events


@given(PIECES, CUTS)
def test_a_text_completion_stream(pieces: list[str], cuts: list[int]) -> None:
    raw = b"".join(
        _event({"choices": [{"index": 0, "text": p, "finish_reason": None}]}, False) for p in pieces
    )
    raw += _event({"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]}, False)
    choices = [e["choices"][0] for e in _run(COMPLETIONS, raw + b"data: [DONE]\n\n", cuts)]
    thought = "".join(c.get("reasoning_content", "") for c in choices)
    assert (thought, "".join(c["text"] for c in choices)) == split("".join(pieces))


@given(PIECES, CUTS)
def test_a_responses_stream(pieces: list[str], cuts: list[int]) -> None:
    item = {"type": "message", "id": "msg_1", "role": "assistant", "content": []}
    text = "".join(pieces)
    done_item = {**item, "content": [{"type": "output_text", "text": text}]}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": {"id": "resp_1"}},
        {"type": "response.output_item.added", "item": item},
        {
            "type": "response.content_part.added",
            "item_id": "msg_1",
            "part": {"type": "output_text", "text": ""},
        },
        *({"type": "response.output_text.delta", "item_id": "msg_1", "delta": p} for p in pieces),
        {"type": "response.output_text.done", "item_id": "msg_1", "text": text},
        {"type": "response.output_item.done", "item": done_item},
        {"type": "response.completed", "response": {"output": [done_item]}},
    ]
    out = _run(RESPONSES, b"".join(_event(e, True) for e in events), cuts)
    thought, rest = split(text)
    deltas = [e for e in out if e["type"] == "response.reasoning_text.delta"]
    assert "".join(e["delta"] for e in deltas) == thought
    texts = [e for e in out if e["type"] == "response.output_text.delta"]
    assert "".join(e["delta"] for e in texts) == rest
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    added = [
        (e["output_index"], e["item"]["type"])
        for e in out
        if e["type"] == "response.output_item.added"
    ]
    assert [i for i, _ in added] == list(range(len(added)))  # numbered as they are sent
    assert sorted(t for _, t in added) == (["message", "reasoning"] if thought else ["message"])
    if thought and not rest:  # all thinking: its item before the (empty) message
        assert added[0][1] == "reasoning"
    final = out[-1]["response"]["output"]
    assert [i["type"] for i in final] == [t for _, t in added]  # the stream's order
    message_at = next(i for i, t in added if t == "message")
    assert final[message_at]["content"][0]["text"] == rest
    assert all(e["output_index"] == message_at for e in texts)


@given(PIECES, CUTS)
def test_a_messages_stream(pieces: list[str], cuts: list[int]) -> None:
    start = {"type": "message_start", "message": {"id": "m", "content": []}}
    events: list[dict[str, Any]] = [
        start,
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        *(
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}}
            for p in pieces
        ),
        {"type": "content_block_stop", "index": 0},
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "tool_use", "id": "t", "name": "f", "input": {}},
        },
        {"type": "content_block_stop", "index": 1},
        {"type": "message_stop"},
    ]
    out = _run(MESSAGES, b"".join(_event(e, True) for e in events), cuts)
    starts = [
        (e["index"], e["content_block"]["type"]) for e in out if e["type"] == "content_block_start"
    ]
    assert [i for i, _ in starts] == list(range(len(starts)))  # numbered on, in order
    assert starts[-1][1] == "tool_use"
    kinds = dict(starts)
    thought = "".join(
        e["delta"].get("thinking", "") for e in out if e["type"] == "content_block_delta"
    )
    text = "".join(
        e["delta"].get("text", "")
        for e in out
        if e["type"] == "content_block_delta" and kinds[e["index"]] == "text"
    )
    assert (thought, text) == split("".join(pieces))
    stops = [e["index"] for e in out if e["type"] == "content_block_stop"]
    assert stops == list(range(len(starts)))  # each block closed once, before the next
    assert out[-1]["type"] == "message_stop"


def test_whole_replies_of_each_route() -> None:
    completion = json.dumps({"choices": [{"index": 0, "text": "<think>hm</think>Hi"}]})
    choice = json.loads(whole_reply(completion.encode(), Thinking(COMPLETIONS, "reasoning")))
    assert choice["choices"][0] == {"index": 0, "text": "Hi", "reasoning": "hm"}
    message = {
        "type": "message",
        "id": "msg_7",
        "content": [{"type": "output_text", "text": "<think>hm</think>Hi"}],
    }
    response = json.dumps({"output": [message]}).encode()
    output = json.loads(whole_reply(response, Thinking(RESPONSES, "reasoning_content")))["output"]
    assert output[0] == {
        "type": "reasoning",
        "id": "rs_7",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": "hm"}],
        "status": "completed",
    }
    assert output[1]["content"][0]["text"] == "Hi"
    assert whole_reply(response, Thinking(RESPONSES, "none")) == response
    anthropic = json.dumps({"content": [{"type": "text", "text": "<think>hm"}]}).encode()
    blocks = json.loads(whole_reply(anthropic, Thinking(MESSAGES, "reasoning")))["content"]
    assert blocks == [{"type": "thinking", "thinking": "hm", "signature": ""}]
