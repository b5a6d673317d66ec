"""An engine's event stream cut into whole events, what the stages of the pass
(reshape.py) are (each takes one whole event and gives the events to send in its place),
and how a stream fitbox writes ends: its figures, then ``data: [DONE]``.

A call's ``Server-Timing`` figures, from its row's stamps (box/calls.py: ``Call.stamps``),
so a response and its call row always agree; ``figures()`` is the one derivation, in ms:

    queue = (admitted_at, or the end when never placed) - received_at - load
    load  = load_ready_at - max(load_start_at, received_at)    0 when the model was resident
    ttft  = first_byte_at - received_at                         once a first byte went
    total = last_byte_at - received_at                          once the last byte went

The header's value, and a stream's last figures as an SSE comment (``: server-timing …``)
put just before its ``data: [DONE]`` (the pass, reshape.py). The middleware that sends the
header and the trailer is server/door/timing.py's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
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


DONE = b"data: [DONE]"


def figures(stamps: Mapping[str, float | None]) -> dict[str, float]:
    """The call's figures in ms, those its stamps allow, in the order a header lists them."""
    received = stamps.get("received_at")
    if received is None:
        return {}
    start, ready = stamps.get("load_start_at"), stamps.get("load_ready_at")
    load = max(0.0, ready - max(start, received)) if start and ready else 0.0
    placed, first, last = (stamps.get(k) for k in ("admitted_at", "first_byte_at", "last_byte_at"))
    out: dict[str, float] = {}
    if placed or last:
        out["queue"] = max(0.0, (placed or last or received) - received - load) * 1000
        out["load"] = load * 1000
    if first:
        out["ttft"] = (first - received) * 1000
    if last:
        out["total"] = (last - received) * 1000
    return out


def header_value(found: Mapping[str, float]) -> str:
    """``queue;dur=1.2, load;dur=0, …`` (W3C: metric *( ";" param ), dur in ms)."""
    return ", ".join(f"{name};dur={value:.1f}" for name, value in found.items())


def sse_comment(stamps: Mapping[str, float | None]) -> bytes:
    """The stream's last figures as an SSE comment (clients skip comment lines)."""
    return b": server-timing " + header_value(figures(stamps)).encode() + b"\n\n"


def done_frame(stamps: Mapping[str, float | None]) -> bytes:
    """A stream's end as fitbox writes it: the figures, then ``data: [DONE]``."""
    return sse_comment(stamps) + DONE + b"\n\n"


def done_at(events: bytes) -> int:
    """Where ``data: [DONE]`` begins in ``events`` (whole events), or -1. A JSON string
    cannot hold it after a real newline (its newlines are escaped)."""
    if events.startswith(DONE):
        return 0
    at = events.find(b"\n\n" + DONE)
    return at + 2 if at >= 0 else -1
