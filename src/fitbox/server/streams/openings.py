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
These stages of the pass put back what is missing and drop what is repeated, event by
event, and let every other byte through as it came: only a stream's first events are read,
and a Responses stream's chunks only where one of its opening events is in them. The
``message_start`` a Messages stream lacks is made by the pass itself (reshape.py), which
may await the prompt's count for it.
"""

from __future__ import annotations

import secrets
from typing import Any

from fitbox.server.streams.events import event_data, frame

_RESPONSE_OPENINGS = (b"event: response.created\n", b"event: response.in_progress\n")


def message_start(model: str, prompt_tokens: int | None) -> bytes:
    """A Messages stream's opening event (with its ``\\n\\n``): its model the served name
    (put back as the asked one after), its input tokens the prompt as the engine counts it
    (0 when it cannot say within its time)."""
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
    return frame({"type": "message_start", "message": message}, "message_start") + b"\n\n"


class MessagesOpening:
    """A Messages stream opens with ``message_start``: ``missing`` says its first event is
    another (the pass makes one)."""

    def __init__(self) -> None:
        self.first = True
        self.missing = False

    def passes(self, chunk: bytes) -> bool:
        return not self.first

    def event(self, event: bytes) -> list[bytes]:
        if self.first:
            self.first = False
            data = event_data(event)
            self.missing = data is not None and data.get("type") != "message_start"
        return [event]


class ChatOpening:
    """Each choice of a chat stream opens with a chunk whose delta is the role; one is made
    (from the choice's first chunk, its text left out) for a choice that opens without."""

    def __init__(self, choices: int) -> None:
        self.waiting = set(range(choices))  # the choices whose first chunk has not come

    def passes(self, chunk: bytes) -> bool:
        return not self.waiting

    def event(self, event: bytes) -> list[bytes]:
        if not self.waiting:
            return [event]
        if self.waiting == {0} and b'"role":' in event:
            # one choice, and its delta has the role (a bare ``"role":`` is no text's: its
            # quotes would be escaped): opened, unparsed
            self.waiting.clear()
            return [event]
        data = event_data(event)
        choices = data.get("choices") if data is not None else None
        if data is None or not isinstance(choices, list):
            return [event]
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
                openings.append(frame({**_without_figures(data), "choices": [role]}))
        return [*openings, event]


def _without_figures(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k not in ("timings", "usage", "choices")}


class ResponsesOpening:
    """A Responses stream says ``response.created`` and ``response.in_progress`` once."""

    def __init__(self) -> None:
        self.seen: set[bytes] = set()

    def passes(self, chunk: bytes) -> bool:
        return not any(o in chunk for o in _RESPONSE_OPENINGS)

    def event(self, event: bytes) -> list[bytes]:
        opening = next((o for o in _RESPONSE_OPENINGS if event.startswith(o)), None)
        if opening is None:
            return [event]
        if opening in self.seen:
            return []
        self.seen.add(opening)
        return [event]
