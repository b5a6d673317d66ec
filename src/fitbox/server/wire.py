"""What fitbox writes to a client's socket: what is ready together goes as one send.

uvicorn writes each ASGI message at once (``transport.write``; its httptools protocol, read
in 0.54): a whole reply is two sends, its status line and headers, then its body, written
one after the other in the same step of the event loop; a stream's end is two or three
(its last event, ``data: [DONE]``, the last chunk ``0``). Each send on loopback is a
syscall and a wake-up of the client (with TCP_NODELAY, a segment each), and on a loaded
box the send itself is where the sender loses its CPU to the client it wakes.

:class:`Joined` holds what a connection writes during one step of the loop and sends it as
one write when that step ends (``call_soon``): only what is already there is joined, and
nothing waits for anything to come, so a stream's header still leaves before the engine's
first token is awaited, and each token as soon as the step that read it ends. The first
write of a step schedules the send; later writes of the same step join it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class Joined(asyncio.Transport):
    """A transport whose writes of one loop step go out together; all else is the real
    transport's."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._held:
            self._loop.call_soon(self.flush)
        self._held.append(bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    @property
    def raw(self) -> asyncio.Transport:
        """The socket's own transport, for what must write to it directly (``loop.sendfile``
        checks the transport's kind): :meth:`flush` first, so what was written goes before."""
        return self._transport

    def flush(self) -> None:
        """Send what this step wrote so far, now."""
        held, self._held = self._held, []
        if held and not self._transport.is_closing():
            self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self) -> None:
        self.flush()  # what this step wrote goes first: close sends the buffer, then closes
        self._transport.close()

    def abort(self) -> None:
        self._held = []
        self._transport.abort()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._held))

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)


class JoinedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol writing through :class:`Joined` (``fitbox serve``)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(Joined(transport, self.loop))
