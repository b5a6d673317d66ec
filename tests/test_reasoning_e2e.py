"""A real model that thinks, on the real engine, seen by the openai SDK: SmolLM2 made to
write ``<think>`` … ``</think>`` by a grammar (llama-server's own GBNF sampling, so every
token is the model's), whole and streamed, closed and unclosed, for each field setting:
the box's, a key's, and ``none``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from .support.clients import openai_client
from .support.processes import FitboxProcess, running_fitbox

pytestmark = pytest.mark.engine
SMOL = "SmolLM2-135M-Instruct.Q4_1"
HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello."}]
THINKS = {"grammar": 'root ::= "<think>" [a-z]{2,6} "</think>" [a-z]{1,6}'}
NEVER_CLOSES = {"grammar": 'root ::= "<think>" [a-z]{60,80}'}


@pytest.fixture(scope="module")
def box(
    tmp_path_factory: pytest.TempPathFactory, smollm2: Path, llama_server_bin: Path
) -> Iterator[FitboxProcess]:
    with running_fitbox(tmp_path_factory.mktemp("home"), [smollm2.parent]) as running:
        yield running


def _client(box: FitboxProcess, key: str = "unused") -> openai.OpenAI:
    return openai_client(box.url, api_key=key, max_retries=0)


def _whole(box: FitboxProcess, extra: dict[str, Any], key: str = "unused") -> Any:
    with _client(box, key) as client:
        reply = client.chat.completions.create(
            model=SMOL, messages=HELLO, max_tokens=24, temperature=0, extra_body=extra
        )
    return reply.choices[0].message


def _streamed(box: FitboxProcess, extra: dict[str, Any]) -> list[dict[str, Any]]:
    """Each chunk's delta, as the SDK gives it (extra fields included)."""
    with _client(box) as client:
        stream = client.chat.completions.create(
            model=SMOL, messages=HELLO, max_tokens=24, temperature=0, stream=True, extra_body=extra
        )
        return [c.choices[0].delta.model_dump() for c in stream if c.choices]


def test_a_whole_reply_keeps_its_thinking_out_of_content(box: FitboxProcess) -> None:
    message = _whole(box, THINKS)
    thought = (message.model_extra or {}).get("reasoning_content")
    assert thought and thought.isalpha()
    assert message.content and message.content.isalpha()  # the words after </think>


def test_a_stream_keeps_its_thinking_out_of_content_with_its_tags_split(
    box: FitboxProcess,
) -> None:
    deltas = _streamed(box, THINKS)
    thought = "".join(d.get("reasoning_content") or "" for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    assert thought.isalpha() and content.isalpha()
    # the engine wrote the tags in pieces: no one delta of the untouched stream holds one
    raw = _streamed(box, THINKS | {"reasoning_format": "none"})
    with_tags = [d.get("content") or "" for d in raw]
    assert "<think>" in "".join(with_tags) and not any("<think>" in d for d in with_tags)
    assert thought + content == "".join(with_tags).replace("<think>", "").replace("</think>", "")


def test_a_reply_that_never_closes_its_tag_is_all_thinking(box: FitboxProcess) -> None:
    message = _whole(box, NEVER_CLOSES)
    assert (message.model_extra or {})["reasoning_content"].isalpha()
    assert not message.content
    deltas = _streamed(box, NEVER_CLOSES)
    assert "".join(d.get("reasoning_content") or "" for d in deltas).isalpha()
    assert not "".join(d.get("content") or "" for d in deltas)


def test_the_field_is_a_key_setting_and_a_box_setting(box: FitboxProcess) -> None:
    made = httpx.post(
        f"{box.url}/v1/keys", json={"name": "vllm-style", "scopes": ["inference"]}, timeout=30
    ).json()
    set_key = httpx.post(
        f"{box.url}/v1/settings/key",
        json={"key": made["id"], "reasoning_field": "reasoning"},
        timeout=30,
    )
    assert set_key.json()["effective"]["reasoning_field"] == "reasoning", set_key.text
    message = _whole(box, THINKS, key=made["key"])
    extra = message.model_extra or {}
    assert extra["reasoning"].isalpha() and "reasoning_content" not in extra
    bad = httpx.post(
        f"{box.url}/v1/settings/key", json={"key": made["id"], "reasoning_field": "thoughts"}
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "reasoning_field"
    unknown = httpx.post(
        f"{box.url}/v1/settings/key", json={"key": "000000000000", "progress": True}
    )
    assert unknown.status_code == 400 and unknown.json()["error"]["code"] == "key_not_found"
    box_none = httpx.post(f"{box.url}/v1/settings/box", json={"reasoning_field": "none"})
    assert box_none.status_code == 200, box_none.text
    try:
        message = _whole(box, THINKS)
        assert message.content.startswith("<think>")  # left where the model wrote it
        assert "reasoning_content" not in (message.model_extra or {})
        # the key's own setting outranks the box's
        assert (_whole(box, THINKS, key=made["key"]).model_extra or {})["reasoning"]
    finally:
        httpx.post(f"{box.url}/v1/settings/box", json={"reasoning_field": None})


# The other routes that carry generated text: each in its own API's shape.


def test_a_text_completion_keeps_its_thinking_beside_its_text(box: FitboxProcess) -> None:
    with _client(box) as client:
        reply = client.completions.create(
            model=SMOL, prompt="Say hello.", max_tokens=24, temperature=0, extra_body=THINKS
        )
        choice = reply.choices[0]
        assert (choice.model_extra or {})["reasoning_content"].isalpha()
        assert choice.text.isalpha()
        stream = client.completions.create(
            model=SMOL,
            prompt="Say hello.",
            max_tokens=24,
            temperature=0,
            extra_body=THINKS,
            stream=True,
        )
        chunks = [c.choices[0] for c in stream if c.choices]
    thought = "".join((c.model_extra or {}).get("reasoning_content") or "" for c in chunks)
    assert thought == (choice.model_extra or {})["reasoning_content"]
    assert "".join(c.text for c in chunks) == choice.text


def test_a_response_puts_its_thinking_in_a_reasoning_item(box: FitboxProcess) -> None:
    """Whole, and streamed through the SDK's own stream helper, which rebuilds the response
    from the events by their output_index and refuses items it cannot place."""
    with _client(box) as client:
        reply = client.responses.create(
            model=SMOL, input="Say hello.", max_output_tokens=24, temperature=0, extra_body=THINKS
        )
        first, message = reply.output
        assert first.type == "reasoning" and first.content
        thought = first.content[0].text
        assert thought.isalpha() and message.type == "message"
        assert reply.output_text.isalpha()
        with client.responses.stream(
            model=SMOL, input="Say hello.", max_output_tokens=24, temperature=0, extra_body=THINKS
        ) as stream:
            events = list(stream)
            final = stream.get_final_response()
        left = THINKS | {"reasoning_format": "none"}
        unsplit = client.responses.create(
            model=SMOL, input="Say hello.", max_output_tokens=24, temperature=0, extra_body=left
        )
    deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    assert "".join(deltas) == thought and len(deltas) > 1  # streamed as it came
    texts = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert texts == reply.output_text
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.output_text == reply.output_text
    assert unsplit.output_text.startswith("<think>") and len(unsplit.output) == 1


def _messages(box: FitboxProcess, prefill: str, stream: bool) -> httpx.Response:
    """An Anthropic Messages call whose reply begins with ``prefill``: llama-server's
    Messages route drops a grammar, but it writes an assistant prefill back at the start of
    the reply, and the model goes on from it (its own tokens after the tag)."""
    body = {
        "model": SMOL,
        "max_tokens": 12,
        "temperature": 0,
        "stream": stream,
        "messages": [
            {"role": "user", "content": "Say hello."},
            {"role": "assistant", "content": prefill},
        ],
    }
    return httpx.post(f"{box.url}/v1/messages", json=body, timeout=60)


def _message_events(response: httpx.Response) -> list[dict[str, Any]]:
    events = []
    for event in response.text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in event.splitlines() if ": " in line)
        if "data" in lines and lines["data"].startswith("{"):
            data = json.loads(lines["data"])
            assert lines.get("event") == data["type"]
            events.append(data)
    return events


def test_a_message_puts_its_thinking_in_a_thinking_block(box: FitboxProcess) -> None:
    closed = _messages(box, "<think>hm</think>", stream=False).json()
    assert closed["content"][0] == {"type": "thinking", "thinking": "hm", "signature": ""}
    assert closed["content"][1]["type"] == "text" and "<" not in closed["content"][1]["text"]
    unclosed = _messages(box, "<think>", stream=False).json()
    assert [b["type"] for b in unclosed["content"]] == ["thinking"]
    events = _message_events(_messages(box, "<think>", stream=True))
    assert events[-1]["type"] == "message_stop"
    starts = [e for e in events if e["type"] == "content_block_start"]
    assert [(e["index"], e["content_block"]["type"]) for e in starts] == [(0, "thinking")]
    thought = "".join(e["delta"]["thinking"] for e in events if e["type"] == "content_block_delta")
    assert thought == unclosed["content"][0]["thinking"]
    events = _message_events(_messages(box, "<think>hm</think>", stream=True))
    blocks = {
        e["index"]: e["content_block"]["type"] for e in events if e["type"] == "content_block_start"
    }
    assert blocks == {0: "thinking", 1: "text"}
    stops = [e["index"] for e in events if e["type"] == "content_block_stop"]
    assert stops == [0, 1]
    text = "".join(
        e["delta"].get("text", "")
        for e in events
        if e["type"] == "content_block_delta" and e["index"] == 1
    )
    assert text == closed["content"][1]["text"]
