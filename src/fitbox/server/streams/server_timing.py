"""A call's ``Server-Timing`` figures, from its row's stamps (box/calls.py: ``Call.stamps``),
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

from collections.abc import Mapping

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
