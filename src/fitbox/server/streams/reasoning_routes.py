"""A model's thinking out of the text on every route that carries generated text, whole and
streamed, each in its own API's shape:

- ``/v1/chat/completions``: ``message.reasoning_content`` / ``delta.reasoning_content``
  (server/streams/reasoning.py, which this module hands chat to as it is).
- ``/v1/completions``: the choice's ``reasoning_content`` (or ``reasoning``) beside its
  ``text``; OpenAI has no field for it there, so it is the chat field's name, on the choice.
- ``/v1/responses``: a ``reasoning`` output item before the message (``content`` of
  ``reasoning_text`` parts, ``summary`` empty), streamed as ``response.output_item.added``,
  ``response.content_part.added``, ``response.reasoning_text.delta`` / ``.done``, as the
  openai SDK's ``ResponseReasoningItem`` and its stream events are shaped.
- ``/v1/messages``: a ``thinking`` content block before the text (Anthropic's shape;
  ``signature`` is empty: a local model signs nothing), streamed as ``thinking_delta``
  events in a block of its own; the blocks after it are numbered on.

The field setting (box, key, or the call's ``"reasoning_format": "none"``) names the field
for the two routes that have one (chat, completions); on Responses and Messages the shape is
the API's own, and ``none`` leaves the thinking in the text there too. llama-server splits
no thinking on these routes for a template it does not know (and on ``/v1/completions``
never), so fitbox does, with the same ``ThinkSplitter``; what the engine split itself (a
``reasoning`` item, a ``thinking`` block) passes untouched. As with chat, thinking that is
interleaved with text in one reply is gathered before it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from fitbox.box.box import Box
from fitbox.server.streams import reasoning
from fitbox.server.streams.reasoning import NONE, ThinkSplitter

COMPLETIONS, RESPONSES, MESSAGES = "/v1/completions", "/v1/responses", "/v1/messages"
ROUTES = frozenset({reasoning.CHAT, COMPLETIONS, RESPONSES, MESSAGES})


@dataclass(frozen=True)
class Thinking:
    """Where one call's thinking goes: its route (which shape) and the field setting."""

    path: str
    field: str

    @property
    def splits(self) -> bool:
        return self.field != NONE


def for_call(request: Request, path: str, body: dict[str, Any]) -> Thinking | None:
    """The call's thinking setting; None for a route that carries no generated text."""
    if path not in ROUTES:
        return None
    if body.get("reasoning_format") == NONE:
        return Thinking(path, NONE)
    box: Box = request.app.state.box
    key = getattr(request.state, "api_key", None)
    return Thinking(path, str(box.prefs.for_key(key.key_id if key else None)["reasoning_field"]))


def field_of(thinking: Thinking | None) -> str | None:
    return thinking.field if thinking is not None else None


def request_body(raw: bytes, thinking: Thinking | None) -> bytes:
    """The call as the engine gets it (``none``: the engine is asked to split nothing)."""
    return reasoning.request_body(raw, field_of(thinking))


def split(text: str) -> tuple[str, str]:
    """(thinking, text) of a whole text: an unclosed tag's text is thinking to its end."""
    splitter = ThinkSplitter()
    thought, rest = splitter.feed(text)
    tail_thought, tail_rest = splitter.finish()
    return thought + tail_thought, rest + tail_rest


def whole(content: bytes, thinking: Thinking | None) -> bytes:
    """A whole reply with its thinking in its route's shape; the bytes as they came when
    nothing changes."""
    if thinking is None or thinking.path == reasoning.CHAT:
        return reasoning.whole(content, field_of(thinking))
    if not thinking.splits or reasoning.OPEN.encode() not in content:
        return content
    try:
        body = json.loads(content)
    except ValueError:
        return content
    if not isinstance(body, dict):
        return content
    if thinking.path == COMPLETIONS:
        changed = _completion_choices(body, thinking.field)
    elif thinking.path == RESPONSES:
        changed = _response_output(body)
    else:
        changed = _message_content(body)
    return dumps(body) if changed else content


def dumps(body: dict[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def _completion_choices(body: dict[str, Any], field: str) -> bool:
    changed = False
    for choice in body.get("choices") or []:
        text = choice.get("text") if isinstance(choice, dict) else None
        if isinstance(text, str) and reasoning.OPEN in text:
            thought, choice["text"] = split(text)
            if thought:
                choice[field] = thought
            changed = True
    return changed


def reasoning_id(message_id: str) -> str:
    """The id of the reasoning item fitbox puts before message ``message_id``."""
    return "rs_" + message_id.removeprefix("msg_")


def reasoning_item(message_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}] if text else []
    return {
        "type": "reasoning",
        "id": reasoning_id(message_id),
        "summary": [],
        "content": content,
        "status": status,
    }


def message_text(item: dict[str, Any]) -> str:
    return "".join(
        part.get("text") or ""
        for part in item.get("content") or []
        if isinstance(part, dict) and part.get("type") == "output_text"
    )


def set_message_text(item: dict[str, Any], text: str) -> None:
    """The message's first output_text part holds ``text``; its other ones are emptied."""
    for part in item.get("content") or []:
        if isinstance(part, dict) and part.get("type") == "output_text":
            part["text"], text = text, ""


def _response_output(body: dict[str, Any]) -> bool:
    """A Responses body: each message whose text thinks gets a reasoning item before it."""
    output = body.get("output")
    if not isinstance(output, list):
        return False
    items: list[Any] = []
    for item in output:
        if isinstance(item, dict) and item.get("type") == "message":
            thought, text = split(message_text(item))
            if thought:
                items.append(reasoning_item(str(item.get("id", "")), thought))
                set_message_text(item, text)
        items.append(item)
    changed = len(items) != len(output)
    body["output"] = items
    return changed


def thinking_block(text: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": ""}


def _message_content(body: dict[str, Any]) -> bool:
    """A Messages body: a text block that thinks becomes a thinking block and the text."""
    content = body.get("content")
    if not isinstance(content, list):
        return False
    blocks: list[Any] = []
    changed = False
    for block in content:
        text = block.get("text") if isinstance(block, dict) else None
        if isinstance(text, str) and block.get("type") == "text" and reasoning.OPEN in text:
            thought, rest = split(text)
            changed = True
            if thought:
                blocks.append(thinking_block(thought))
            if rest or not thought:
                blocks.append({**block, "text": rest})
            continue
        blocks.append(block)
    body["content"] = blocks
    return changed
