"""A real model that thinks, on the real engine, seen by the openai SDK: SmolLM2 made to
write ``<think>`` … ``</think>`` by a grammar (llama-server's own GBNF sampling, so every
token is the model's), whole and streamed, closed and unclosed, for each field setting:
the box's, a key's, and ``none``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from .conftest import FitboxProcess, running_fitbox

pytestmark = pytest.mark.engine
SMOL = "SmolLM2-135M-Instruct.Q4_1"
HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello."}]
THINKS = {"grammar": 'root ::= "<think>" [a-z]{2,6} "</think>" [a-z]{1,6}'}
NEVER_CLOSES = {"grammar": 'root ::= "<think>" [a-z]{60,80}'}


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory, smollm2: Path,
        llama_server_bin: Path) -> Iterator[FitboxProcess]:  # fmt: skip
    with running_fitbox(tmp_path_factory.mktemp("home"), [smollm2.parent]) as running:
        yield running


def _client(box: FitboxProcess, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{box.url}/v1", api_key=key, max_retries=0)


def _whole(box: FitboxProcess, extra: dict[str, Any], key: str = "unused") -> Any:
    with _client(box, key) as client:
        reply = client.chat.completions.create(model=SMOL, messages=HELLO, max_tokens=24,
                                               temperature=0, extra_body=extra)  # fmt: skip
    return reply.choices[0].message


def _streamed(box: FitboxProcess, extra: dict[str, Any]) -> list[dict[str, Any]]:
    """Each chunk's delta, as the SDK gives it (extra fields included)."""
    with _client(box) as client:
        stream = client.chat.completions.create(model=SMOL, messages=HELLO, max_tokens=24,
                                                temperature=0, stream=True,
                                                extra_body=extra)  # fmt: skip
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
    made = httpx.post(f"{box.url}/v1/keys", json={"name": "vllm-style", "scopes": ["inference"]},
                      timeout=30).json()  # fmt: skip
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
