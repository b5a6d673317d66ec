"""ASGI's ``http.response.zerocopysend`` for uvicorn's httptools protocol: a file's bytes go
from the page cache to the socket with ``os.sendfile`` (asyncio's ``loop.sendfile``), never
through Python.

uvicorn 0.54 offers neither ``zerocopysend`` nor ``pathsend``; a transfer's body written
through it a block at a time (read on a thread, a ``bytes`` each, ``transport.write``
copying what the socket did not take) cost the source box ~0.35 CPU s per 375 MiB, on 2
cores taken from the pull it serves. This protocol adds the extension to each request's
scope where the connection can take it (asyncio's own socket transport; not uvloop's, not
TLS): the response's start and its last (empty) body go through uvicorn as usual, the file
between them through this. A server without it (h11, uvloop, tests' in-process clients)
never sees the extension, and the app streams the file as before (server/manage/transfer.py).

The file is sent in windows; before each, the next window is asked of the disk
(``POSIX_FADV_WILLNEED``, on a thread) so that ``sendfile`` on the event loop finds its
pages in the cache rather than waiting on a slow drive. A window goes in steps of
``STEP`` bytes; a step the client does not take within ``send_stall_timeout`` (the
protocol's, set by server/door/connections.py) ends the connection, so a reader that stops
reading frees its transfer slot instead of holding it for ever.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

ZEROCOPY = "http.response.zerocopysend"
WINDOW = 8 << 20  # how far ahead the disk is asked
STEP = 1 << 20  # one sendfile call's range: a reader must take this much per stall timeout


def can_zerocopy(transport: asyncio.BaseTransport) -> bool:
    """asyncio's plain socket transport, the one ``loop.sendfile`` sends natively from."""
    loop = asyncio.get_running_loop()
    return (
        isinstance(loop, asyncio.BaseEventLoop)  # uvloop's loop has no sendfile
        and getattr(transport, "_sendfile_compatible", None) is not None
        and transport.get_extra_info("sslcontext") is None
        and transport.get_extra_info("socket") is not None
        and hasattr(os, "sendfile")
    )


class ZeroCopyHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, plus ``http.response.zerocopysend``."""

    send_stall_timeout: ClassVar[float | None] = None  # seconds a step may wait; None: for ever

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if can_zerocopy(self.transport):
            self.scope.setdefault("extensions", {})[ZEROCOPY] = {}

    def on_headers_complete(self) -> None:
        super().on_headers_complete()  # makes self.cycle; its task reads cycle.send later
        cycle = self.cycle
        if cycle is not None and ZEROCOPY in cycle.scope.get("extensions", {}):
            plain, stall = cycle.send, self.send_stall_timeout

            async def send(message: Any) -> None:
                if message["type"] == ZEROCOPY:
                    await _send_file(cycle, message, stall)
                    if not message.get("more_body", False) and not cycle.disconnected:
                        await plain({"type": "http.response.body", "body": b"", "more_body": False})
                    return
                await plain(message)

            cycle.send = send  # type: ignore[method-assign]


async def _send_file(
    cycle: RequestResponseCycle, message: dict[str, Any], stall: float | None = None
) -> None:
    """``count`` bytes of ``file`` from ``offset`` down the cycle's socket, within its
    Content-Length. A client that went away, or takes no step within ``stall`` seconds, or a
    file that shrank, ends the connection (the client sees a short body and resumes, as a
    cut)."""
    if not cycle.response_started or cycle.response_complete or cycle.chunked_encoding:
        raise RuntimeError(f"{ZEROCOPY} needs a started response with a Content-Length")
    if cycle.flow.write_paused and not cycle.disconnected:
        await cycle.flow.drain()
    if cycle.disconnected or cycle.scope["method"] == "HEAD":  # a HEAD's body is never sent
        return
    file, at = message["file"], int(message.get("offset") or 0)
    count = int(message["count"]) if message.get("count") is not None else None
    left = cycle.expected_content_length if count is None else count
    if left > cycle.expected_content_length:
        raise RuntimeError("Response content longer than Content-Length")
    fd = file.fileno()
    ahead = asyncio.ensure_future(_ask_disk(fd, at, min(left, WINDOW)))
    try:
        while left > 0:
            await ahead  # this window asked of the disk; the next one now, while it is sent
            window = min(left, WINDOW)
            ahead = asyncio.ensure_future(_ask_disk(fd, at + window, min(left - window, WINDOW)))
            sent = await _send_window(cycle, file, at, window, stall)
            at, left = at + sent, left - sent
            if sent < window:
                cycle.disconnected = True
                cycle.transport.close()
                return
    finally:
        ahead.cancel()
        with contextlib.suppress(asyncio.CancelledError, OSError):
            await ahead


async def _send_window(
    cycle: RequestResponseCycle, file: Any, at: int, count: int, stall: float | None
) -> int:
    """Bytes sent of ``count`` from ``at``, a step at a time; fewer when the client went
    away or took no step within ``stall`` seconds."""
    loop = asyncio.get_running_loop()
    done = 0
    while done < count:
        step = min(count - done, STEP)
        try:
            async with asyncio.timeout(stall):
                sent = await loop.sendfile(cycle.transport, file, at + done, step)
        except (OSError, RuntimeError, TimeoutError):  # gone (RuntimeError: closing), stalled
            sent = 0
        cycle.expected_content_length -= sent
        done += sent
        if sent < step:
            break
    return done


async def _ask_disk(fd: int, at: int, count: int) -> None:
    if count > 0 and hasattr(os, "posix_fadvise"):
        await asyncio.to_thread(os.posix_fadvise, fd, at, count, os.POSIX_FADV_WILLNEED)
