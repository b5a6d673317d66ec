"""The central's HTTP to one box: the box's own lean HTTP/1.1 client (engines/http1.py) with
keep-alive connections, for the mirror's requests and the calls it forwards.

Why not httpx: every call on a box moves its change counter twice (the call's row opens,
then ends), and each move is a long-poll answer and a page the mirror reads, so a call
through the central was five requests on httpx and a fresh connection for the forwarded
one, all on the loop that relays the reply. bench/central.py, CPU of the central's process
per call made to the box directly (its mirror's share): 18.75 ms on httpx, 5.25 ms on this.

A kept connection the box closed while it sat idle (its keep-alive timer; a box that was
paused closes them all as it resumes) fails before any byte of an answer: the request is
sent once more on a fresh connection (``EnginePool.request``). The box never read it, so
it was never taken; a box that dies with a call taken fails the fresh try too, and routing
moves on to the next box as before the first byte.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlencode, urlsplit

from fitbox.engines.http1 import EngineConnectionError, EnginePool, EngineResponse

READ_S = 600.0  # a forwarded call: the longest wait for its reply's next bytes


class BoxHttpError(EngineConnectionError):
    """A box answered a mirror request with an error status."""


class BoxUnreachable(EngineConnectionError):
    """No answer from a box (refused, reset, closed before a status line), in its words."""


class BoxHttp:
    def __init__(self, url: str) -> None:
        self.url = url
        parts = urlsplit(url)
        https = parts.scheme == "https"
        self.pool = EnginePool(
            parts.hostname or "",
            parts.port or (443 if https else 80),
            ssl.create_default_context() if https else None,
        )

    async def send(
        self, method: str, path: str, body: bytes, headers: dict[str, str], limit_s: float = READ_S
    ) -> EngineResponse:
        """The box's answer once its status line and headers are here (within ``limit_s``)."""
        async with asyncio.timeout(limit_s):
            return await self._request(method, path, body, headers)

    async def _request(
        self, method: str, path: str, body: bytes, headers: dict[str, str]
    ) -> EngineResponse:
        try:
            return await self.pool.request(method, path, body, headers)
        except EngineConnectionError as exc:  # its words name an engine: say which box
            why = repr(exc.__cause__) if exc.__cause__ else str(exc)
            raise BoxUnreachable(f"{self.url} did not answer: {why}") from exc

    async def get_json(
        self, path: str, headers: dict[str, str], limit_s: float, **params: Any
    ) -> Any:
        """GET ``path``'s JSON; a status of 400 or more raises ``BoxHttpError``."""
        target = f"{path}?{urlencode(params)}" if params else path
        async with asyncio.timeout(limit_s):
            response = await self._request("GET", target, b"", headers)
            try:
                raw = await response.read()
            finally:
                response.close()
        if response.status >= 400:
            raise BoxHttpError(f"GET {path}: HTTP {response.status}: {raw[:300]!r}")
        return json.loads(raw)

    async def close(self) -> None:
        await self.pool.aclose()


async def relayed(response: EngineResponse, limit_s: float = READ_S) -> AsyncIterator[bytes]:
    """The body as it comes, each piece within ``limit_s``; the connection goes back to the
    pool once the body was read whole, and is dropped otherwise."""
    pieces = response.iter_bytes()
    try:
        while True:
            async with asyncio.timeout(limit_s):
                try:
                    piece = await anext(pieces)
                except StopAsyncIteration:
                    return
            yield piece
    finally:
        response.close()  # the connection is dropped unless the body was read whole
