"""An engine's event stream, cut into whole events and relayed through a shaper: what the
stream shapers (reasoning.py, reasoning_streams.py, openings.py) are built on."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any, Protocol


class EventCutter:
    """A stream cut into whole events: each is held until its ``\\n\\n``, and handed on
    without it."""

    def __init__(self) -> None:
        self.pending = b""

    def whole(self, chunk: bytes) -> list[bytes]:
        """The events ``chunk`` completes (a cut one waits for the rest)."""
        self.pending += chunk
        end = self.pending.rfind(b"\n\n")
        if end < 0:
            return []
        events, self.pending = self.pending[: end + 2], self.pending[end + 2 :]
        return [e for e in events.split(b"\n\n") if e]

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


class Shaper(Protocol):
    def feed(self, chunk: bytes) -> bytes: ...
    def finish(self) -> bytes: ...


async def relay(chunks: AsyncGenerator[bytes, None], shaper: Shaper) -> AsyncGenerator[bytes, None]:
    """``chunks`` through ``shaper``; closing this closes ``chunks`` at once (its end
    releases the call's lease)."""
    try:
        async for chunk in chunks:
            out = shaper.feed(chunk)
            if out:
                yield out
        rest = shaper.finish()
        if rest:
            yield rest
    finally:
        await chunks.aclose()
