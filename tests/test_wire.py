"""server/wire.py: what a connection writes in one loop step leaves as one send, at that
step's end, and nothing waits for a write that has not come. Real loopback sockets; the
peer reads with MSG_DONTWAIT, so "not sent yet" is what the kernel has, not a guess."""

from __future__ import annotations

import asyncio
import socket

from fitbox.server.wire import Joined


async def _pair() -> tuple[Joined, socket.socket, asyncio.Transport]:
    """A Joined transport on a real TCP connection, and its peer's plain socket."""
    loop = asyncio.get_running_loop()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    connecting = loop.create_connection(asyncio.Protocol, *listener.getsockname())
    (transport, _), (peer, _) = await asyncio.gather(connecting, loop.sock_accept(listener))
    listener.close()
    peer.setblocking(True)
    assert isinstance(transport, asyncio.Transport)
    return Joined(transport, loop), peer, transport


def _arrived(peer: socket.socket) -> bytes:
    try:
        return peer.recv(65536, socket.MSG_DONTWAIT)
    except BlockingIOError:
        return b""


async def _sent(peer: socket.socket, size: int) -> bytes:
    got = b""
    async with asyncio.timeout(5):
        while len(got) < size:
            got += _arrived(peer)
            await asyncio.sleep(0.001)
    return got


async def _one_steps_writes_leave_together_at_its_end() -> None:
    joined, peer, real = await _pair()
    try:
        joined.write(b"HTTP/1.1 200 OK\r\n\r\n")
        joined.write(b"body")
        assert _arrived(peer) == b""  # still this step: nothing sent yet
        assert joined.get_write_buffer_size() == len(b"HTTP/1.1 200 OK\r\n\r\nbody")
        await asyncio.sleep(0)  # the step ends: one write of both
        assert await _sent(peer, 23) == b"HTTP/1.1 200 OK\r\n\r\nbody"
    finally:
        real.close()
        peer.close()


async def _a_lone_write_waits_for_nothing_that_has_not_come() -> None:
    joined, peer, real = await _pair()
    try:
        joined.write(b"data: {}\n\n")
        await asyncio.sleep(0)  # no second write comes: the first is sent anyway
        assert await _sent(peer, 10) == b"data: {}\n\n"
        joined.write(b"data: [DONE]\n\n")  # a later step's write is a send of its own
        await asyncio.sleep(0)
        assert await _sent(peer, 14) == b"data: [DONE]\n\n"
    finally:
        real.close()
        peer.close()


async def _close_sends_what_was_written_first() -> None:
    joined, peer, real = await _pair()
    try:
        joined.write(b"last")
        joined.close()
        assert joined.is_closing()
        assert await _sent(peer, 4) == b"last"
        peer.setblocking(False)
        async with asyncio.timeout(5):
            while await asyncio.get_running_loop().sock_recv(peer, 16) != b"":
                pass  # then the end of the connection
    finally:
        real.close()
        peer.close()


async def _abort_drops_what_was_held() -> None:
    joined, peer, real = await _pair()
    try:
        joined.write(b"never")
        joined.abort()
        await asyncio.sleep(0.01)
        assert _arrived(peer) == b""
    finally:
        real.close()
        peer.close()


def test_one_steps_writes_leave_together_at_its_end() -> None:
    asyncio.run(_one_steps_writes_leave_together_at_its_end())


def test_a_lone_write_waits_for_nothing_that_has_not_come() -> None:
    asyncio.run(_a_lone_write_waits_for_nothing_that_has_not_come())


def test_close_sends_what_was_written_first() -> None:
    asyncio.run(_close_sends_what_was_written_first())


def test_abort_drops_what_was_held() -> None:
    asyncio.run(_abort_drops_what_was_held())


async def _flush_sends_now_and_raw_is_the_socket_transport() -> None:
    joined, peer, real = await _pair()
    try:
        joined.write(b"head")
        joined.flush()  # before a direct write to the socket's transport (sendfile)
        assert joined.raw is real
        real.write(b"file")
        assert await _sent(peer, 8) == b"headfile"
    finally:
        real.close()
        peer.close()


def test_flush_sends_now_and_raw_is_the_socket_transport() -> None:
    asyncio.run(_flush_sends_now_and_raw_is_the_socket_transport())
