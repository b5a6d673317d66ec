"""A lean HTTP/1.1 client for talking to engine children over loopback.

fitbox talks to its own llama-server children on 127.0.0.1 (and a central to its boxes,
central/box_link.py), so it needs a small part of HTTP/1.1: one request at a time per
connection, bodies framed by Content-Length or chunked transfer coding, keep-alive with a
per-peer pool. Measured against httpx on the same calls (bench/proxy_overhead.py), this
costs ~0.3 ms of CPU per call instead of ~1.8 ms, which on a small box is CPU taken from
the engine itself.

A pooled connection the engine closed while idle (cpp-httplib drops some after a stream,
and all after 100 requests or 5 idle seconds) fails before any response byte arrives; the
request is then sent once more on a fresh connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

CONNECT_TIMEOUT_S = 10.0
IDLE_EXPIRY_S = 2.0  # below cpp-httplib's 5 s keep-alive timeout
MAX_IDLE = 16
MAX_HEADER_BYTES = 64 * 1024
READ_SIZE = 64 * 1024
CLOSE_WAIT_S = 2.0


class EngineConnectionError(ConnectionError):
    """The engine could not be reached, or broke off a response."""


@dataclass
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    idle_since: float = field(default_factory=time.monotonic)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


class EngineResponse:
    def __init__(self, pool: EnginePool, conn: _Conn, status: int, headers: dict[str, str]):
        self.status = status
        self.headers = headers
        self._pool = pool
        self._conn: _Conn | None = conn
        self._keep_alive = headers.get("connection", "").lower() != "close"
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        self._remaining = int(length) if length is not None and not self._chunked else None
        self._done = False
        self._kept: bytes | None = None  # the whole body, read ahead once (``kept``)

    async def iter_bytes(self) -> AsyncIterator[bytes]:
        """The body's data as it arrives (chunk framing removed)."""
        if self._kept is not None:  # read ahead: given again, whole
            if self._kept:
                yield self._kept
            return
        assert self._conn is not None
        reader = self._conn.reader
        try:
            if self._chunked:
                async for data in self._dechunk(reader):
                    yield data
            elif self._remaining is not None:
                while self._remaining > 0:
                    data = await reader.read(min(READ_SIZE, self._remaining))
                    if not data:
                        raise EngineConnectionError("engine closed the connection mid-body")
                    self._remaining -= len(data)
                    yield data
            else:  # no framing: the body runs to the end of the connection
                self._keep_alive = False
                while data := await reader.read(READ_SIZE):
                    yield data
            self._done = True
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            raise EngineConnectionError(f"engine broke off the response: {exc!r}") from exc

    @staticmethod
    async def _dechunk(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
        """Remove chunked framing, one await per network read rather than per chunk: every
        complete chunk in what has arrived is yielded as one piece."""
        buf = b""
        while True:
            more = await reader.read(READ_SIZE)
            if not more:
                raise EngineConnectionError("engine closed the connection mid-stream")
            buf += more
            out: list[bytes] = []
            while True:
                line_end = buf.find(b"\r\n")
                if line_end < 0:
                    break
                size = int(buf[:line_end].split(b";", 1)[0].strip(), 16)
                if size == 0:
                    if buf.find(b"\r\n\r\n", line_end) < 0:
                        break  # the (empty) trailer section has not all arrived yet
                    if out:
                        yield b"".join(out)
                    return
                end = line_end + 2 + size
                if len(buf) < end + 2:
                    break  # the chunk is not all here yet
                out.append(buf[line_end + 2 : end])
                buf = buf[end + 2 :]
            if out:
                yield b"".join(out)

    async def read(self) -> bytes:
        parts = [part async for part in self.iter_bytes()]
        return b"".join(parts)

    async def kept(self) -> bytes:
        """The whole body, read now and kept: ``read`` and ``iter_bytes`` give it again
        (an error body fitbox reads before it decides whether the call goes on)."""
        if self._kept is None:
            self._kept = await self.read()
        return self._kept

    def close(self) -> None:
        """Give the connection back if the body was read to its end, else drop it."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._done and self._keep_alive:
            self._pool._release(conn)
        else:
            conn.close()


class EnginePool:
    """Keep-alive connections to one engine child."""

    def __init__(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> None:
        self.host = host
        self.port = port
        self.tls = tls  # an https peer (a box behind TLS); engine children never are
        self._idle: list[_Conn] = []

    async def _connect(self) -> _Conn:
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel that
            # comes as the connection opens, and the connection would be left open
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                reader, writer = await asyncio.open_connection(
                    self.host,
                    self.port,
                    limit=MAX_HEADER_BYTES,
                    ssl=self.tls,
                    server_hostname=self.host if self.tls else None,
                )
        except (OSError, TimeoutError) as exc:
            raise EngineConnectionError(
                f"cannot connect to the engine on {self.host}:{self.port}: {exc!r}"
            ) from exc
        return _Conn(reader, writer)

    def _take_idle(self) -> _Conn | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if now - conn.idle_since < IDLE_EXPIRY_S and not conn.reader.at_eof():
                return conn
            conn.close()
        return None

    def _release(self, conn: _Conn) -> None:
        if len(self._idle) >= MAX_IDLE:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        self._idle.append(conn)

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> EngineResponse:
        """Send a request; returns once the status line and headers have arrived."""
        head = [
            f"{method} {path} HTTP/1.1",
            f"Host: {self.host}:{self.port}",
            f"Content-Length: {len(body)}",
        ]
        head += [f"{name}: {value}" for name, value in (headers or {}).items()]
        payload = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
        conn = self._take_idle()
        if conn is not None:
            try:
                return await self._exchange(conn, payload)
            except EngineConnectionError:
                pass  # the engine dropped an idle connection: one fresh try below
        return await self._exchange(await self._connect(), payload)

    async def _exchange(self, conn: _Conn, payload: bytes) -> EngineResponse:
        try:
            conn.writer.write(payload)
            await conn.writer.drain()
            raw = await conn.reader.readuntil(b"\r\n\r\n")
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            conn.close()
            raise EngineConnectionError(f"engine did not answer: {exc!r}") from exc
        except BaseException:  # a caller's timeout or cancel: the request's state is unknown
            conn.close()
            raise
        lines = raw.decode("latin-1").split("\r\n")
        try:
            status = int(lines[0].split(" ", 2)[1])
        except (IndexError, ValueError) as exc:
            conn.close()
            raise EngineConnectionError(f"engine sent a bad status line {lines[0]!r}") from exc
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        return EngineResponse(self, conn, status, headers)

    async def get(self, path: str) -> tuple[int, bytes]:
        response = await self.request("GET", path)
        try:
            return response.status, await response.read()
        finally:
            response.close()

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()

    async def aclose(self) -> None:
        """Close idle connections and wait until their sockets are really shut."""
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        for conn in idle:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(CLOSE_WAIT_S):  # a stop is never held by a socket
                    await conn.writer.wait_closed()
