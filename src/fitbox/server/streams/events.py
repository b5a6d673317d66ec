"""An engine's event stream cut into whole events, and what the stages of the pass
(server/streams/reshape.py) are: each takes one whole event and gives the events to send in
its place."""

from __future__ import annotations

import json
from typing import Any, Protocol

SEP = b"\n\n"  # the end of an event


class EventCutter:
    """A stream cut into whole events: each is held until its ``\\n\\n``, and handed on
    without it."""

    def __init__(self) -> None:
        self.pending = b""

    def whole(self, chunk: bytes) -> list[bytes]:
        """The events ``chunk`` completes (a cut one waits for the rest)."""
        self.pending += chunk
        end = self.pending.rfind(SEP)
        if end < 0:
            return []
        events, self.pending = self.pending[: end + 2], self.pending[end + 2 :]
        return [e for e in events.split(SEP) if e]

    def finish(self) -> bytes:
        """What was held when the stream ended (an event with no ``\\n\\n``)."""
        rest, self.pending = self.pending, b""
        return rest


def event_data(event: bytes) -> dict[str, Any] | None:
    """An event's JSON object (``data: {…}``, after an ``event:`` line or not); None for
    any other event."""
    at = event.find(b"data: {")
    if at < 0 or (at > 0 and event[at - 1 : at] != b"\n"):
        return None
    try:
        data = json.loads(event[at + 6 :])
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def dumps(body: dict[str, Any]) -> bytes:
    """JSON as llama-server writes it: no spaces, UTF-8 as it is."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def frame(data: dict[str, Any], name: str | None = None) -> bytes:
    """One event (without its ``\\n\\n``), named (``event: <name>``) or not."""
    return (b"event: " + name.encode() + b"\n" if name else b"") + b"data: " + dumps(data)


class Stage(Protocol):
    """One step of the pass over a stream's events."""

    def passes(self, chunk: bytes) -> bool:
        """Whether ``chunk`` (whole events) goes on as it came, not even cut: the fast path."""
        ...

    def event(self, event: bytes) -> list[bytes]:
        """The events (each without its ``\\n\\n``) to send in place of ``event``."""
        ...


class NamedShaper:
    """A stage over a stream that names each event (``event: <type>``) before its data, as
    Responses and Messages streams do: subclasses say what becomes of one parsed event."""

    def passes(self, chunk: bytes) -> bool:
        return False

    def event(self, event: bytes) -> list[bytes]:
        data = event_data(event)
        out = None if data is None else self.shape(data)
        return [event] if out is None else [self.frame(e) for e in out]

    def frame(self, data: dict[str, Any]) -> bytes:
        return frame(data, str(data.get("type", "")))

    def shape(self, data: dict[str, Any]) -> list[dict[str, Any]] | None:
        """The events to send for ``data``; None sends the event as it came."""
        raise NotImplementedError
