"""server/streams/thinking.py in process: the streaming ``<think>`` splitter over every chunking
hypothesis finds, and the whole and streamed chat reply shapes (the stream through the one
pass, server/streams/reshape.py) for each field setting."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from fitbox.server.streams import thinking
from fitbox.server.streams.reshape import Pass, stages_for
from fitbox.server.streams.thinking import CHAT, Thinking, ThinkSplitter

PIECES = st.lists(
    st.sampled_from(
        ["<think>", "</think>", "<", "</", "<th", "think>", "k>", "a", "b c", "\n", "é", "<b>", ">"]
    ),
    max_size=30,
).map("".join)


def _split(text: str, cuts: list[int]) -> tuple[str, str]:
    splitter, reasoning, content, at = ThinkSplitter(), "", "", 0
    for cut in [*sorted({min(c, len(text)) for c in cuts}), len(text)]:
        r, c = splitter.feed(text[at:cut])
        reasoning, content, at = reasoning + r, content + c, cut
    r, c = splitter.finish()
    return reasoning + r, content + c


@given(PIECES, st.lists(st.integers(0, 400), max_size=20))
def test_any_chunking_splits_as_the_whole_text_does(text: str, cuts: list[int]) -> None:
    assert _split(text, cuts) == _split(text, [])


@given(PIECES)
def test_every_tag_is_taken_and_nothing_else_is_lost(text: str) -> None:
    # the text between the tags, not the absence of "<think>" in what is left: "<" and
    # "think>" around a taken pair are content that reads as a tag once the pair is gone
    assert _split(text, []) == _taken_tags(text)


def _taken_tags(text: str) -> tuple[str, str]:
    """(reasoning, content) of a whole text: what lies between each ``<think>`` and the
    next ``</think>`` is thinking, the rest content, the tags themselves taken."""
    parts: tuple[list[str], list[str]] = ([], [])
    inside = False
    while True:
        tag = "</think>" if inside else "<think>"
        at = text.find(tag)
        if at < 0:
            parts[0 if inside else 1].append(text)
            return "".join(parts[0]), "".join(parts[1])
        parts[0 if inside else 1].append(text[:at])
        text, inside = text[at + len(tag) :], not inside


def test_a_tag_across_pieces_and_an_unclosed_one() -> None:
    s = ThinkSplitter()
    assert [s.feed("<thi"), s.feed("nk>hm"), s.feed("m</th"), s.feed("ink>Hi")] == [
        ("", ""),
        ("hm", ""),
        ("m", ""),
        ("", "Hi"),
    ]
    s = ThinkSplitter()
    assert (s.feed("<think>still thinking <"), s.finish()) == (("still thinking ", ""), ("<", ""))


def _target(field: str | None) -> Thinking | None:
    return Thinking(CHAT, field) if field is not None else None


def whole(content: bytes, field: str | None) -> bytes:
    """A whole chat reply with the field setting ``field`` (None: no chat call)."""
    return thinking.whole(content, _target(field))


def request_body(raw: bytes, field: str | None) -> bytes:
    return thinking.request_body(raw, _target(field))


def _events(contents: list[str | None]) -> bytes:
    out = b""
    for i, text in enumerate(contents):
        last = i == len(contents) - 1
        chunk = {
            "choices": [
                {
                    "index": 0,
                    "delta": {} if text is None else {"content": text},
                    "finish_reason": "stop" if last else None,
                }
            ]
        }
        out += b"data: " + json.dumps(chunk).encode() + b"\n\n"
    return out + b"data: [DONE]\n\n"


def _deltas(stream: bytes) -> list[dict[str, Any]]:
    events = [e for e in stream.split(b"\n\n") if e.startswith(b"data: {")]
    return [json.loads(e[6:])["choices"][0]["delta"] for e in events]


@given(
    st.lists(PIECES, min_size=1, max_size=8),
    st.lists(st.integers(0, 2000), max_size=12),
    st.sampled_from(["reasoning_content", "reasoning"]),
)
def test_a_stream_over_any_chunking_carries_the_thinking_in_its_field(
    pieces: list[str], cuts: list[int], field: str
) -> None:
    raw = _events([*pieces, None])
    shaper, out, at = Pass(stages_for(CHAT, Thinking(CHAT, field))), b"", 0
    for cut in [*sorted({min(c, len(raw)) for c in cuts}), len(raw)]:
        out += shaper.feed(raw[at:cut])
        at = cut
    out += shaper.finish()
    assert out.endswith(b"data: [DONE]\n\n")
    deltas = _deltas(out)
    reasoning = "".join(d.get(field, "") for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    assert (reasoning, content) == _split("".join(pieces), [])
    other = {"reasoning_content", "reasoning"} - {field}
    assert not any(other & set(d) for d in deltas)


def _reply(message: dict[str, Any]) -> bytes:
    return json.dumps({"choices": [{"index": 0, "message": message}]}).encode()


def _message(content: bytes) -> dict[str, Any]:
    message: dict[str, Any] = json.loads(content)["choices"][0]["message"]
    return message


def test_a_whole_reply_for_each_field_setting() -> None:
    thought = _reply({"role": "assistant", "content": "<think>hm</think>Hi"})
    assert _message(whole(thought, "reasoning_content")) == {
        "role": "assistant",
        "reasoning_content": "hm",
        "content": "Hi",
    }
    assert _message(whole(thought, "reasoning")) == {
        "role": "assistant",
        "reasoning": "hm",
        "content": "Hi",
    }
    assert whole(thought, "none") == thought and whole(thought, None) == thought
    # what the engine split itself is renamed, never split twice
    split = _reply({"role": "assistant", "content": "Hi", "reasoning_content": "hm"})
    assert whole(split, "reasoning_content") == split
    assert _message(whole(split, "reasoning")) == {
        "role": "assistant",
        "content": "Hi",
        "reasoning": "hm",
    }
    unclosed = _reply({"role": "assistant", "content": "<think>and on"})
    assert _message(whole(unclosed, "reasoning_content"))["reasoning_content"] == "and on"
    assert whole(b"not json <think>", "reasoning") == b"not json <think>"


def test_none_asks_the_engine_to_leave_the_thinking_in_content() -> None:
    raw = b'{"model": "m", "messages": []}'
    assert json.loads(request_body(raw, "none"))["reasoning_format"] == "none"
    assert request_body(raw, "reasoning") == raw and request_body(raw, None) == raw
    mine = b'{"model": "m", "reasoning_format": "deepseek"}'  # the client's own wins
    assert json.loads(request_body(mine, "none"))["reasoning_format"] == "deepseek"
