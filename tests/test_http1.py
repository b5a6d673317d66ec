"""The engine HTTP/1.1 client against a server that frames bodies every legal way, split
at every byte, and drops idle connections the way cpp-httplib does."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import pytest

from fitbox.engines.http1 import EngineConnectionError, EnginePool

Reply = Callable[[bytes], list[bytes]]  # request bytes -> pieces to write, in order


class Served:
    def __init__(self, reply: Reply, close_after: int) -> None:
        self.reply, self.close_after = reply, close_after
        self.writers: list[asyncio.StreamWriter] = []
        self.port = 0

    @property
    def connections(self) -> int:
        return len(self.writers)


@contextlib.asynccontextmanager
async def serving(reply: Reply, close_after: int = 1000) -> AsyncIterator[Served]:
    served = Served(reply, close_after)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served.writers.append(writer)
        for _ in range(close_after):
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                break
            length = int(
                next(
                    (
                        ln.split(b":")[1]
                        for ln in head.split(b"\r\n")
                        if ln.lower().startswith(b"content-length")
                    ),
                    b"0",
                )
            )
            body = await reader.readexactly(length)
            for piece in reply(head + body):
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(0)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    served.port = server.sockets[0].getsockname()[1]
    try:
        yield served
    finally:
        server.close()
        for writer in served.writers:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
        await server.wait_closed()


def bytewise(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


def chunked(*parts: bytes, trailer: bytes = b"") -> bytes:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts)
    return head + body + b"0\r\n" + trailer + b"\r\n"


async def collect(pool: EnginePool, path: str = "/") -> tuple[int, bytes, list[bytes]]:
    response = await pool.request("POST", path, b"{}")
    pieces = [piece async for piece in response.iter_bytes()]
    response.close()
    return response.status, b"".join(pieces), pieces


@pytest.mark.parametrize("split", [lambda d: [d], bytewise])
@pytest.mark.parametrize("trailer", [b"", b"X-Trailer: yes\r\n"])
def test_chunked_bodies_arrive_whole_however_they_are_split(
    split: Callable[[bytes], list[bytes]], trailer: bytes
) -> None:
    async def run() -> None:
        data = chunked(b"data: one\n\n", b"data: two\n\n", b"x" * 5000, trailer=trailer)
        async with serving(lambda req: split(data)) as served:
            pool = EnginePool("127.0.0.1", served.port)
            for _ in range(3):  # and the connection is reused afterwards
                status, body, _ = await collect(pool)
                assert status == 200
                assert body == b"data: one\n\ndata: two\n\n" + b"x" * 5000
            assert served.connections == 1
            await pool.aclose()

    asyncio.run(run())


def test_content_length_and_connection_close() -> None:
    async def run() -> None:
        data = b"HTTP/1.1 404 Not Found\r\nContent-Length: 5\r\nConnection: close\r\n\r\nnope!"
        async with serving(lambda req: bytewise(data), close_after=1) as served:
            pool = EnginePool("127.0.0.1", served.port)
            for _ in range(2):
                assert await pool.get("/x") == (404, b"nope!")
            assert served.connections == 2  # "Connection: close" was honoured
            await pool.aclose()

    asyncio.run(run())


def test_an_idle_connection_the_server_dropped_is_replaced_once() -> None:
    async def run() -> None:
        ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
        async with serving(lambda req: [ok], close_after=1) as served:
            pool = EnginePool("127.0.0.1", served.port)
            assert await pool.get("/") == (200, b"ok")
            await served.writers[0].wait_closed()  # the server closed it, silently
            assert await pool.get("/") == (200, b"ok")
            assert served.connections == 2
            await pool.aclose()

    asyncio.run(run())


def test_a_body_cut_short_is_an_error_not_a_short_answer() -> None:
    async def run() -> None:
        cut = chunked(b"data: one\n\n")[:-12]
        async with serving(lambda req: [cut], close_after=1) as served:
            pool = EnginePool("127.0.0.1", served.port)
            response = await pool.request("POST", "/", b"{}")
            with pytest.raises(EngineConnectionError):
                async for _ in response.iter_bytes():
                    pass
            response.close()
            await pool.aclose()

    asyncio.run(run())


def test_nobody_listening_is_a_connection_error() -> None:
    async def run() -> None:
        async with serving(lambda req: []) as served:
            port = served.port
        with pytest.raises(EngineConnectionError, match="cannot connect"):
            await EnginePool("127.0.0.1", port).get("/health")

    asyncio.run(run())


def test_a_body_read_ahead_is_given_again_whole_and_its_connection_reused() -> None:
    """``kept``: the error body fitbox reads before deciding (a refusal that carries the
    prompt's count) is the same body whoever reads the response after."""

    async def run() -> None:
        data = chunked(b'{"error":', b'{"code":400}}')
        async with serving(lambda req: bytewise(data)) as served:
            pool = EnginePool("127.0.0.1", served.port)
            response = await pool.request("POST", "/", b"{}")
            assert await response.kept() == b'{"error":{"code":400}}'
            assert await response.kept() == b'{"error":{"code":400}}'  # not read twice
            assert [p async for p in response.iter_bytes()] == [b'{"error":{"code":400}}']
            assert await response.read() == b'{"error":{"code":400}}'
            response.close()
            assert (await collect(pool))[1] == b'{"error":{"code":400}}'
            assert served.connections == 1  # read to its end: the connection went back
            await pool.aclose()

    asyncio.run(run())
