"""``Server-Timing`` (W3C Server Timing) on every response fitbox sends.

The figures come from a call's row stamps (server/streams/events.py: ``figures()``,
the one derivation), so a response and its call row always agree.

A whole reply (or an error) carries all it has in its header. A streamed reply's header
carries what is known when it goes out (queue, load); the rest comes in a last SSE comment
(``: server-timing queue;dur=…, …``) before ``data: [DONE]`` (put there by the stream's one
pass, server/streams/reshape.py), and in an HTTP trailer where
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
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fitbox.server.streams.events import figures, header_value

STAMPS_STATE = "call_stamps"  # request.state name of the call's stamps (server/inference/openai.py)
TRAILERS = "http.response.trailers"


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
