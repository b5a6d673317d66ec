"""What a connection may cost the box before any route runs: uvicorn's httptools protocol
with bounds on what a client can hold.

- A request's line and headers (its *head*) are at most ``request_head_max`` bytes and
  ``request_headers_max`` headers: more is answered 431 before the rest is read (httptools
  would otherwise gather a header of any size in memory, and the door reads headers before
  it can refuse anyone).
- A head must arrive within ``request_head_timeout`` seconds of the connection (or of its
  first byte, on a kept-alive one): a connection that sends nothing is closed, a slow head
  answered 408. A body must arrive within ``request_body_timeout`` of its head; a deadline
  that falls while the server is the one waiting (not reading a body the app has not asked
  for yet, or not yet having said "100 Continue") starts again.
- A response that waits ``send_stall_timeout`` seconds on a client that takes none of it
  (the socket's buffer full) is cut off, so a reader that stops frees what it held.
- At most ``connections_max`` connections are open (default: half the open-file limit
  left after a reserve); one more is answered 503 and closed, so idle sockets can never
  take every file descriptor from the store and the engines.

Each refusal is an OpenAI-shaped JSON body with ``Connection: close``; what the client
sent after it is read and dropped for a moment so the refusal is not lost to a reset.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any, ClassVar

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from fitbox.errors import (
    FitboxError,
    HeadersTooLarge,
    RequestTimeout,
    TooManyConnections,
)
from fitbox.quiet_server import Hushed
from fitbox.server.door.framing import JsonFramingErrors
from fitbox.server.door.limits import ConnectionLimits
from fitbox.server.manage.zerocopy import ZeroCopyHttpToolsProtocol

log = logging.getLogger("fitbox.connections")

LINGER_S = 1.0  # how long a refused connection's further bytes are read and dropped
WARN_EVERY_S = 60.0  # a refusal of many clients is logged once per minute, with a count


class _TooManyHeaders(Exception):
    """Raised from the parser's header callback: it stops the parse where it is."""


_over_cap = Hushed(log, WARN_EVERY_S)
_stalls = Hushed(log, WARN_EVERY_S)


def http_protocol(limits: ConnectionLimits, zerocopy: bool = False) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol under ``limits``, a request it cannot parse answered
    with an OpenAI error body (server/door/framing.py); with ``zerocopy``, the one that sends
    transfers' files with ``sendfile`` (server/manage/zerocopy.py), its sends bounded by the
    same stall timeout."""
    base = ZeroCopyHttpToolsProtocol if zerocopy else HttpToolsProtocol
    attributes = {"limits": limits, "send_stall_timeout": limits.send_stall_timeout}
    bases = (JsonFramingErrors, GuardedHttpToolsProtocol, base)  # JSON for what cannot parse
    made: type[HttpToolsProtocol] = type(f"Guarded{base.__name__}", bases, attributes)
    return made


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    limits: ClassVar[ConnectionLimits] = ConnectionLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_open = True  # reading a head (none has begun, or the last message ended)
        self._head_seen = 0  # bytes of that head received
        self._header_count = 0
        self._too_many_headers = False
        self._refused = False
        self._deadline: asyncio.TimerHandle | None = None  # the head's or the body's
        self._stall: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        cap = self.limits.connections
        if cap is not None and len(self.connections) > cap:
            _over_cap.warn("refused connections over the cap of %d (connections_max)", cap)
            self._refuse(
                TooManyConnections(
                    f"This box has {cap} connections open, its cap (connections_max); try "
                    "again shortly.",
                    retry_after=1.0,
                ),
                linger=False,  # it sent nothing yet; a flood of them must not hold files
            )
            return
        self._arm(self.limits.head_timeout, self._head_late)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._unstall()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused or self.transport.is_closing():
            return  # a refused client's further bytes, dropped
        if self._head_open:
            room = self.limits.head_bytes - self._head_seen
            self._head_seen += min(len(data), room)
            if len(data) > room:
                self._feed(data[:room])  # the head may end within its limit
                if self._head_open:
                    if not self._refused and not self.transport.is_closing():
                        self._refuse(
                            HeadersTooLarge(
                                "The request's line and headers are over this box's "
                                f"{self.limits.head_bytes} bytes (request_head_max)."
                            )
                        )
                    return
                data = data[room:]
                if self.transport.get_protocol() is not self or self.transport.is_closing():
                    return
        self._feed(data)

    def _feed(self, data: bytes) -> None:
        """uvicorn's ``data_received``, with a header count over the limit answered 431."""
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError:
            if not self._too_many_headers:
                self._bad_request()
                return
            self._refuse(
                HeadersTooLarge(
                    f"The request has more than this box's {self.limits.header_count} "
                    "headers (request_headers_max)."
                )
            )
        except httptools.HttpParserError:
            self._bad_request()
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()

    def _bad_request(self) -> None:
        msg = "Invalid HTTP request received."
        self.logger.warning(msg)
        self.send_400_response(msg)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_count = 0
        if self._deadline is None:  # a kept-alive connection's next request: from its first byte
            self._arm(self.limits.head_timeout, self._head_late)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self.limits.header_count:
            self._too_many_headers = True
            raise _TooManyHeaders
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._head_open, self._head_seen = False, 0
        self._disarm()
        self._arm(self.limits.body_timeout, self._body_late)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        self._head_open, self._head_seen = True, 0
        super().on_message_complete()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stall is None:
            self._stall = self.loop.call_later(self.limits.send_stall_timeout, self._stalled)

    def resume_writing(self) -> None:
        self._unstall()
        super().resume_writing()

    def _unstall(self) -> None:
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None

    def _stalled(self) -> None:
        self._stall = None
        if not self.transport.is_closing():
            _stalls.warn(
                "cut off clients that took no bytes for %.0f s (send_stall_timeout)",
                self.limits.send_stall_timeout,
            )
            self.transport.abort()  # what it has not taken is dropped; its call ends

    def _head_late(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # a response is still being sent: the next request's head waits its turn
            self._arm(self.limits.head_timeout, self._head_late)
        elif self._head_seen == 0:
            self.transport.close()  # nothing sent: an idle connection, closed quietly
        else:
            self._refuse(
                RequestTimeout(
                    "The request's line and headers did not arrive within "
                    f"{self.limits.head_timeout:g} s (request_head_timeout)."
                )
            )

    def _body_late(self) -> None:
        self._deadline = None
        cycle = self.cycle
        if self.transport.is_closing() or cycle is None or cycle.response_complete:
            return
        if self.flow.read_paused or cycle.waiting_for_100_continue:
            # the server is not reading yet (or not yet said "100 Continue"): its delay
            self._arm(self.limits.body_timeout, self._body_late)
            return
        if cycle.response_started:
            self.transport.close()
            return
        cycle.disconnected = True  # the app's receive() hears a disconnect; its reply is dropped
        cycle.message_event.set()
        self._refuse(
            RequestTimeout(
                "The request's body did not arrive within "
                f"{self.limits.body_timeout:g} s (request_body_timeout)."
            )
        )

    def _arm(self, after: float, then: Callable[[], None]) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(after, then)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _refuse(self, error: FitboxError, linger: bool = True) -> None:
        """``error`` as the connection's last reply; with ``linger``, the client's further
        bytes are read and dropped for a moment (closing with them unread would reset the
        connection, and the client might never read the reply), then it is closed."""
        self._refused = True
        self._disarm()
        body = json.dumps(error.body(), ensure_ascii=True).encode()
        head = [STATUS_LINE[error.status]]
        extra = [(b"retry-after", b"%d" % int(error.retry_after))] if error.retry_after else []
        for name, value in [*self.server_state.default_headers, *extra]:
            head += [name, b": ", value, b"\r\n"]
        head += [
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"x-should-retry: %s\r\n" % (b"true" if error.retry else b"false"),
            b"connection: close\r\n\r\n",
        ]
        self.transport.write(b"".join(head) + body)
        if linger and self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()
