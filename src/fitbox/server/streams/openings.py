"""The opening events a stream must begin with, where the engine left them out.

llama-server sends a stream's opening with its first generated token (``n_decoded == 1``,
tools/server/server-task.cpp), and sends no piece at all for a token that ends inside a
UTF-8 character (server-context.cpp, ``validate_utf8``). A reply whose first token is the
first byte of an emoji or a CJK character therefore opens without its opening:
- ``/v1/messages``: no ``message_start`` (the Anthropic SDK's stream reader cannot build a
  message without it);
- ``/v1/chat/completions``: no first chunk with ``"role":"assistant"`` (per choice);
- ``/v1/responses``: ``response.created`` and ``response.in_progress`` again before every
  later piece (the flag that sends them once is set only at ``n_decoded == 1``).
This puts back what is missing and drops what is repeated, event by event, and lets every
other byte through as it came: only a stream's first events are read, and a Responses
stream's chunks only where one of its opening events is in them.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from fitbox.server.streams.reasoning import CHAT
from fitbox.server.streams.reasoning_routes import MESSAGES, RESPONSES, dumps
from fitbox.server.streams.sse_events import EventCutter, event_data, relay

SEP = b"\n\n"  # the end of an event
Count = Callable[[], Awaitable[int | None]]
_RESPONSE_OPENINGS = (b"event: response.created\n", b"event: response.in_progress\n")


def _frame(data: dict[str, Any], name: str | None = None) -> bytes:
    return (b"event: " + name.encode() + b"\n" if name else b"") + b"data: " + dumps(data) + SEP


async def _messages_opened(
    chunks: AsyncGenerator[bytes, None], model: str, count: Count
) -> AsyncGenerator[bytes, None]:
    """A Messages stream opens with ``message_start``; one is made when its first event is
    another: its model the served name (put back as the asked one after), its input tokens
    the prompt as the engine counts it (0 when it cannot say within its time)."""
    events = EventCutter()
    try:
        async for chunk in chunks:
            first = events.whole(chunk)
            if not first:
                continue
            data = event_data(first[0])
            if data is not None and data.get("type") != "message_start":
                yield message_start(model, await count())
            yield b"".join(e + SEP for e in first) + events.finish()
            break
        async for chunk in chunks:
            yield chunk
        if rest := events.finish():  # a stream that ended inside its first event
            yield rest
    finally:
        await chunks.aclose()


def message_start(model: str, prompt_tokens: int | None) -> bytes:
    usage = {"input_tokens": prompt_tokens or 0, "output_tokens": 0}
    message: dict[str, Any] = {
        "id": f"msg_{secrets.token_hex(12)}",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": model,
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }
    return _frame({"type": "message_start", "message": message}, "message_start")


class ChatOpening(EventCutter):
    """Each choice of a chat stream opens with a chunk whose delta is the role; one is made
    (from the choice's first chunk, its text left out) for a choice that opens without."""

    def __init__(self, choices: int) -> None:
        super().__init__()
        self.waiting = set(range(choices))  # the choices whose first chunk has not come

    def feed(self, chunk: bytes) -> bytes:
        if not self.waiting:
            return chunk
        out = [self._opened(e) for e in self.whole(chunk)]
        return b"".join(out) + (self.finish() if not self.waiting else b"")

    def _opened(self, event: bytes) -> bytes:
        data = event_data(event) if self.waiting else None
        choices = data.get("choices") if data is not None else None
        if data is None or not isinstance(choices, list):
            return event + SEP
        openings = []
        for choice in choices:
            index = choice.get("index", 0) if isinstance(choice, dict) else None
            if index not in self.waiting:
                continue
            self.waiting.discard(index)
            delta = choice.get("delta")
            if isinstance(delta, dict) and "role" not in delta:
                role = {
                    "index": index,
                    "delta": {"role": "assistant", "content": None},
                    "finish_reason": None,
                }
                openings.append(_frame({**_without_figures(data), "choices": [role]}))
        return b"".join(openings) + event + SEP


def _without_figures(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k not in ("timings", "usage", "choices")}


class ResponsesOpening(EventCutter):
    """A Responses stream says ``response.created`` and ``response.in_progress`` once."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[bytes] = set()

    def feed(self, chunk: bytes) -> bytes:
        if (
            not self.pending
            and chunk.endswith(b"\n\n")
            and not any(o in chunk for o in _RESPONSE_OPENINGS)
        ):
            return chunk  # whole events, no opening among them: as they came
        return b"".join(e + SEP for e in self.whole(chunk) if self._first(e))

    def _first(self, event: bytes) -> bool:
        opening = next((o for o in _RESPONSE_OPENINGS if event.startswith(o)), None)
        if opening is None:
            return True
        if opening in self.seen:
            return False
        self.seen.add(opening)
        return True


def mended(
    chunks: AsyncGenerator[bytes, None], path: str, model: str, choices: int, count: Count
) -> AsyncGenerator[bytes, None]:
    """``chunks`` (an engine's stream on ``path``, of ``choices`` choices) with its opening
    whole; closing this closes ``chunks`` at once. A route with no opening to mend gets
    ``chunks`` itself. ``count`` gives the prompt's tokens, asked only where an opening
    that carries them is made."""
    if path == MESSAGES:
        return _messages_opened(chunks, model, count)
    if path == CHAT:
        return relay(chunks, ChatOpening(choices))
    if path == RESPONSES:
        return relay(chunks, ResponsesOpening())
    return chunks
