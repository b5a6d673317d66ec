"""A model's thinking in its own field, never in ``content``: chat completions, whole and
streamed.

Two hands do it. llama-server runs with ``--reasoning-format deepseek`` where its binary has
the flag (engines/llama_server.py) and moves the thinking of the templates it recognizes to
``reasoning_content`` itself. Whatever still reaches ``content`` inside ``<think>`` …
``</think>`` (a template the engine does not recognize, an engine without the flag) fitbox
splits here, as it streams: a tag split across chunks is held until it is whole, and a
reply that never closes its tag is thinking to its end.

The field a client gets is a setting (box, or per key: box/preferences.py KEY_KNOBS):
``reasoning_content`` (llama.cpp, SGLang), ``reasoning`` (vLLM-style clients), or ``none``:
the engine is asked to leave the thinking in ``content`` (``"reasoning_format": "none"`` in
the call) and fitbox splits nothing. A call that sends ``"reasoning_format": "none"`` itself
gets ``none``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

from starlette.requests import Request

from fitbox.box.box import Box
from fitbox.server.streams.sse_events import EventCutter, relay

OPEN, CLOSE = "<think>", "</think>"
ENGINE_FIELD = "reasoning_content"  # where llama-server puts what it splits
NONE = "none"
CHAT = "/v1/chat/completions"


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


def field_for(request: Request, path: str, body: dict[str, Any]) -> str | None:
    """The field this call's thinking goes to: ``none`` when the call itself asks the
    engine for ``"reasoning_format": "none"`` (as llama-server lets a call), else its key's
    setting, else the box's; None for a call that is no chat completion (nothing is touched)."""
    if path != CHAT:
        return None
    if body.get("reasoning_format") == NONE:
        return NONE
    box: Box = request.app.state.box
    key = getattr(request.state, "api_key", None)
    return str(box.prefs.for_key(key.key_id if key else None)["reasoning_field"])


def request_body(raw: bytes, field: str | None) -> bytes:
    """The call as the engine gets it: with ``none``, ``"reasoning_format": "none"`` put
    first in the object (a field the client sent itself comes later, and wins)."""
    if field != NONE or not raw.lstrip().startswith(b"{"):  # (a UTF-16 body goes as it came)
        return raw
    at = raw.find(b"{")
    return raw[: at + 1] + b'"reasoning_format":"none",' + raw[at + 1 :]


def _split_into(
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


def whole(content: bytes, field: str | None) -> bytes:
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
        _split_into(message, reasoning + tail_r, rest + tail_c, field, isinstance(text, str))
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


class StreamShaper(EventCutter):
    """The same for a stream, event by event (an event is held until its ``\\n\\n``)."""

    def __init__(self, field: str) -> None:
        super().__init__()
        self.field = field
        self.splitters: dict[int, ThinkSplitter] = {}

    def feed(self, chunk: bytes) -> bytes:
        if not self.pending and chunk.endswith(b"\n\n") and self._untouched(chunk):
            return chunk  # whole events, none of which needs a change: as they came
        return b"".join(self._event(e) + b"\n\n" for e in self.whole(chunk))

    def _untouched(self, data: bytes) -> bool:
        """No splitter is inside or holding, no tag may start here, and nothing to rename."""
        return (
            b"<" not in data
            and all(s.idle for s in self.splitters.values())
            and (self.field == ENGINE_FIELD or b'"reasoning_content"' not in data)
        )

    def _event(self, event: bytes) -> bytes:
        if not event.startswith(b"data: {") or self._untouched(event):
            return event  # the fast path: most events hold no tag and need no change
        try:
            body = json.loads(event[6:])
        except ValueError:
            return event
        for choice in body.get("choices") or []:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if not isinstance(delta, dict):
                continue
            splitter = self.splitters.setdefault(int(choice.get("index") or 0), ThinkSplitter())
            text = delta.get("content")
            reasoning, content = splitter.feed(text) if isinstance(text, str) else ("", "")
            if choice.get("finish_reason") is not None:
                tail_r, tail_c = splitter.finish()
                reasoning, content = reasoning + tail_r, content + tail_c
            had_text = isinstance(text, str) or bool(content)
            _split_into(delta, reasoning, content, self.field, had_text)
        return b"data: " + json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


async def shaped(
    chunks: AsyncGenerator[bytes, None], field: str | None
) -> AsyncGenerator[bytes, None]:
    """``chunks`` (an engine's event stream) with the thinking moved; closing this closes
    ``chunks`` at once (its end releases the call's lease)."""
    if field is None or field == NONE:
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            await chunks.aclose()
        return
    async for out in relay(chunks, StreamShaper(field)):
        yield out
