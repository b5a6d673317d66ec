"""Requests uvicorn cannot parse (a broken request line, a bad header, chunked framing that
does not add up) never reach the app: uvicorn answers them itself, with a plain-text 400.
Where HTTP still allows a reply, this one is an OpenAI error body like every other answer of
the box; the connection closes after it, as uvicorn's did (nothing after a framing error can
be trusted to start a request)."""

from __future__ import annotations

import asyncio

from uvicorn.server import ServerState

from fitbox.errors import InvalidRequest
from fitbox.server.door.errors import ErrorJSON

FRAMING = (
    "The request could not be read as HTTP/1.1 ({reason}): check the request line, the "
    "headers and the body's framing (Content-Length or chunked), or use an HTTP client."
)


def framing_reply(reason: str, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    """The whole 400 response, bytes on the wire, for a request uvicorn refused."""
    error = InvalidRequest(FRAMING.format(reason=reason.rstrip(".")), code="bad_http_request")
    body = ErrorJSON(error.body()).body
    head = [b"HTTP/1.1 400 Bad Request"]
    head += [name + b": " + value for name, value in default_headers]
    head += [
        b"content-type: application/json",
        b"content-length: " + str(len(body)).encode("ascii"),
        b"x-should-retry: false",
        b"connection: close",
    ]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


class JsonFramingErrors:
    """A uvicorn HTTP protocol's 400 for a request it could not parse, as JSON (put before
    the protocol class in the bases: ``class P(JsonFramingErrors, HttpToolsProtocol)``)."""

    transport: asyncio.Transport
    server_state: ServerState

    def send_400_response(self, msg: str) -> None:
        self.transport.write(framing_reply(msg, self.server_state.default_headers))
        self.transport.close()
