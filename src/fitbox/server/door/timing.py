"""``Server-Timing`` (W3C Server Timing) on every response fitbox sends.

The figures come from a call's row stamps (box/calls.py: ``Call.stamps``), so a response
and its call row always agree; ``figures()`` is the one derivation, in milliseconds:

    queue = (admitted_at, or the end when never placed) - received_at - load
    load  = load_ready_at - max(load_start_at, received_at)    0 when the model was resident
    ttft  = first_byte_at - received_at                         once a first byte went
    total = last_byte_at - received_at                          once the last byte went

A whole reply (or an error) carries all it has in its header. A streamed reply's header
carries what is known when it goes out (queue, load); the rest comes in a last SSE comment
(``: server-timing queue;dur=…, …``) before ``data: [DONE]``, and in an HTTP trailer where
the server can send one (the ASGI ``http.response.trailers`` extension) and the client sent
``TE: trailers``. uvicorn's HTTP/1.1 protocols (h11, httptools; read in 0.54) do not offer
that extension: their scope has no ``extensions``, a stream ends with a bare last chunk
(``0\r\n\r\n``) and a message after the last body raises. So under ``fitbox serve`` a
stream's last figures are in the SSE comment only. uvicorn 0.54's HTTP/2 protocol
(``http="zttp", http2=True``, which needs the separate ``zttp`` package) does offer it, and
this middleware would need no change there. Starlette's test transport offers it too:
tests/test_timing_e2e.py drives the real route and a real engine through it.

A response that is no call (``/v1/models``, a refused key, management) gets ``total``: the
time from its request's arrival to its status line.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

STAMPS_STATE = "call_stamps"  # request.state name of the call's stamps (server/inference/proxy.py)
TRAILERS = "http.response.trailers"
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
    return sse_comment(stamps) + DONE + b"\n\n"


async def annotated(
    chunks: AsyncGenerator[bytes, None], stamps: Mapping[str, float | None]
) -> AsyncIterator[bytes]:
    """The engine's stream with the figures' comment put before its ``data: [DONE]``. The
    call stamps its last byte when that event arrives (box/calls.py: relay), before the
    piece that holds it is handed on. An end split across pieces gets the comment after it.
    Closing this closes ``chunks`` at once (its ``finally`` releases the call's lease)."""
    pending = True
    try:
        async for chunk in chunks:
            if pending and stamps.get("last_byte_at") is not None:
                at = chunk.find(DONE)
                chunk = (
                    chunk[:at] + sse_comment(stamps) + chunk[at:]
                    if at >= 0
                    else (chunk + sse_comment(stamps))
                )
                pending = False
            yield chunk
    finally:
        await chunks.aclose()


def _te_trailers(scope: Scope) -> bool:
    for name, value in scope.get("headers", []):
        if name.lower() == b"te" and b"trailers" in value.lower():
            return True
    return False


class ServerTimingMiddleware:
    """Adds ``Server-Timing`` to every response's start; sends the trailer where it can."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        arrived = time.time()
        state: dict[str, Any] = scope.setdefault("state", {})
        can_trail = TRAILERS in scope.get("extensions", {}) and _te_trailers(scope)
        trailing = False

        async def timed_send(message: Message) -> None:
            nonlocal trailing
            if message["type"] == "http.response.start":
                stamps = state.get(STAMPS_STATE)
                found = figures(stamps) if stamps else {"total": (time.time() - arrived) * 1000}
                headers = list(message.get("headers", []))
                if found:
                    headers.append((b"server-timing", header_value(found).encode()))
                if can_trail and stamps and "total" not in found:
                    headers.append((b"trailer", b"server-timing"))
                    trailing = True
                message = {**message, "headers": headers, "trailers": trailing}
            await send(message)
            if (
                trailing
                and message["type"] == "http.response.body"
                and not message.get("more_body", False)
            ):
                stamps = state.get(STAMPS_STATE) or {}
                value = header_value(figures(stamps)).encode()
                await send(
                    {
                        "type": TRAILERS,
                        "headers": [(b"server-timing", value)],
                        "more_trailers": False,
                    }
                )

        await self.app(scope, receive, timed_send)
