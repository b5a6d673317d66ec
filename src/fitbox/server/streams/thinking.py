"""A model's thinking out of the text, on every route that carries generated text, whole
and streamed: the one ``<think>`` splitter, the whole replies here, the streams' shapers in
choices.py (chat, completions), responses.py and messages.py.

Two hands do it. llama-server runs with ``--reasoning-format deepseek`` where its binary has
the flag (engines/llama_server.py) and moves the thinking of the templates it recognizes to
``reasoning_content`` itself. Whatever still reaches ``content`` inside ``<think>`` …
``</think>`` (a template the engine does not recognize, an engine without the flag) fitbox
splits, as it streams: a tag split across chunks is held until it is whole, and a
reply that never closes its tag is thinking to its end.

The field a client gets is a setting (box, or per key: box/preferences.py KEY_KNOBS):
``reasoning_content`` (llama.cpp, SGLang), ``reasoning`` (vLLM-style clients), or ``none``:
the engine is asked to leave the thinking in ``content`` (``"reasoning_format": "none"`` in
the call) and fitbox splits nothing. A call that sends ``"reasoning_format": "none"`` itself
gets ``none``.

Each route in its own API's shape:
- ``/v1/chat/completions``: ``message.reasoning_content`` / ``delta.reasoning_content``.
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

from fitbox.server.streams.events import dumps

OPEN, CLOSE = "<think>", "</think>"
ENGINE_FIELD = "reasoning_content"  # where llama-server puts what it splits
NONE = "none"
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
RESPONSES, MESSAGES = "/v1/responses", "/v1/messages"
ROUTES = frozenset({CHAT, COMPLETIONS, RESPONSES, MESSAGES})


@dataclass(frozen=True)
class Thinking:
    """Where one call's thinking goes: its route (which shape) and the field setting."""

    path: str
    field: str

    @property
    def splits(self) -> bool:
        return self.field != NONE


def target(path: str, body: dict[str, Any], setting: str) -> Thinking | None:
    """The call's thinking: ``none`` when the call itself asks the engine for
    ``"reasoning_format": "none"`` (as llama-server lets a call), else ``setting`` (its key's,
    else the box's); None for a route that carries no generated text."""
    if path not in ROUTES:
        return None
    return Thinking(path, NONE if body.get("reasoning_format") == NONE else setting)


def field_of(thinking: Thinking | None) -> str | None:
    return thinking.field if thinking is not None else None


def _partial(text: str, tag: str) -> int:
    """How many characters at the end of ``text`` could begin ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ThinkSplitter:
    """``<think>`` … ``</think>`` out of a text that arrives in pieces.

    >>> s = ThinkSplitter()
    >>> s.feed("<thi"), s.feed("nk>hm</think>Hi"), s.finish()
    (('', ''), ('hm', 'Hi'), ('', ''))
    """

    def __init__(self) -> None:
        self.inside = False
        self.held = ""  # the end of the last piece, which may be the start of a tag

    @property
    def idle(self) -> bool:
        """Nothing held and outside a tag: a piece without ``<`` passes as it is."""
        return not self.inside and not self.held

    def feed(self, text: str) -> tuple[str, str]:
        """The (reasoning, content) this piece completes."""
        text, self.held = self.held + text, ""
        reasoning: list[str] = []
        content: list[str] = []
        while text:
            tag = CLOSE if self.inside else OPEN
            out = reasoning if self.inside else content
            at = text.find(tag)
            if at >= 0:
                out.append(text[:at])
                text = text[at + len(tag) :]
                self.inside = not self.inside
                continue
            keep = _partial(text, tag)
            out.append(text[: len(text) - keep])
            self.held = text[len(text) - keep :]
            break
        return "".join(reasoning), "".join(content)

    def finish(self) -> tuple[str, str]:
        """What is held at the end: an unclosed tag's text is thinking, the rest content."""
        held, self.held = self.held, ""
        return (held, "") if self.inside else ("", held)


def request_body(raw: bytes, thinking: Thinking | None) -> bytes:
    """The call as the engine gets it: with ``none``, ``"reasoning_format": "none"`` put
    first in the object (a field the client sent itself comes later, and wins)."""
    if field_of(thinking) != NONE or not raw.lstrip().startswith(
        b"{"
    ):  # (a UTF-16 body goes as it came)
        return raw
    at = raw.find(b"{")
    return raw[: at + 1] + b'"reasoning_format":"none",' + raw[at + 1 :]


def split_into(
    holder: dict[str, Any], reasoning: str, content: str, field: str, had_text: bool
) -> None:
    """Set ``holder`` (a message or a delta): ``content``, and the thinking (what the engine
    split already, then what fitbox did) in ``field``, present only when there is some."""
    engine = holder.pop(ENGINE_FIELD, None)
    thinking = (engine if isinstance(engine, str) else "") + reasoning
    if thinking:
        holder[field] = thinking
    if had_text:
        holder["content"] = content


def _chat_whole(content: bytes, field: str | None) -> bytes:
    """A whole chat reply with its thinking in ``field``; the bytes as they came when
    nothing changes (no thinking, ``none``, or a body that is no chat reply)."""
    renames = field != ENGINE_FIELD and ENGINE_FIELD.encode() in content
    if field is None or field == NONE or (OPEN.encode() not in content and not renames):
        return content
    try:
        body = json.loads(content)
        choices = body["choices"]
    except (ValueError, KeyError, TypeError):
        return content
    for choice in choices if isinstance(choices, list) else []:
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            continue
        text = message.get("content")
        splitter = ThinkSplitter()
        reasoning, rest = splitter.feed(text) if isinstance(text, str) else ("", "")
        tail_r, tail_c = splitter.finish()
        split_into(message, reasoning + tail_r, rest + tail_c, field, isinstance(text, str))
    return dumps(body)


def split(text: str) -> tuple[str, str]:
    """(thinking, text) of a whole text: an unclosed tag's text is thinking to its end."""
    splitter = ThinkSplitter()
    thought, rest = splitter.feed(text)
    tail_thought, tail_rest = splitter.finish()
    return thought + tail_thought, rest + tail_rest


def whole(content: bytes, thinking: Thinking | None) -> bytes:
    """A whole reply with its thinking in its route's shape; the bytes as they came when
    nothing changes."""
    if thinking is None or thinking.path == CHAT:
        return _chat_whole(content, field_of(thinking))
    if not thinking.splits or OPEN.encode() not in content:
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


def _completion_choices(body: dict[str, Any], field: str) -> bool:
    changed = False
    for choice in body.get("choices") or []:
        text = choice.get("text") if isinstance(choice, dict) else None
        if isinstance(text, str) and OPEN in text:
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
        if isinstance(text, str) and block.get("type") == "text" and OPEN in text:
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
