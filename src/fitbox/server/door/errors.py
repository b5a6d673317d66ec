"""Every error a client sees is ``{"error": {"message", "type", "code", "param"}}``."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from fitbox.errors import FitboxError, StorageFailed
from fitbox.store.db import StoreUnavailable

# the request.state attribute the door (door/auth.py) sets: may the caller see engine internals
INSIDER = "insider"

log = logging.getLogger(__name__)


class ErrorJSON(JSONResponse):
    """An error body as ASCII JSON: whatever a message quotes (a lone surrogate a client
    sent) it can always be encoded, so an error never becomes a second error."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":"), default=str).encode()


INTERNAL = ("log_tail",)  # engine internals: paths, ports, slot state
WITHHELD = " (the engine's log lines are shown to the box itself and to admin keys)"
# a reason naming the box's own paths, owners and modes: the message's end for an insider
OPERATOR_REASON = "operator_reason"
REASON_WITHHELD = " (the box's own paths are shown to the box itself and to admin keys)"


def body_for(error: FitboxError, insider: bool) -> dict[str, Any]:
    """The error's body as this caller may see it: an outsider (an inference key, a trusted
    network) gets the reason without the engine's internals or the box's paths
    (server/door/auth.py: insider)."""
    body = error.body()
    reason = body["error"].pop(OPERATOR_REASON, None)
    if reason is not None:
        said = body["error"]["message"]
        if not insider:
            said += REASON_WITHHELD
        else:  # a sentence goes on with another; a clause with its reason
            said += f" {reason}" if said.endswith(".") else f": {reason}."
        body["error"]["message"] = said
    found = [k for k in INTERNAL if k in body["error"]]
    if found and not insider:
        for k in found:
            del body["error"][k]
        body["error"]["message"] += WITHHELD
    return body


def error_response(
    error: FitboxError, insider: bool = False, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """``headers``: the answer's own besides those the error decides (a 405's ``Allow``)."""
    headers = {**(headers or {}), "x-should-retry": "true" if error.retry else "false"}
    if error.closes:
        headers["connection"] = "close"
    if error.retry and error.retry_after is not None:
        headers["retry-after"] = str(max(1, math.ceil(error.retry_after)))
    return ErrorJSON(body_for(error, insider), status_code=error.status, headers=headers)


async def on_fitbox_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, FitboxError)
    return error_response(exc, bool(getattr(request.state, INSIDER, False)))


async def on_http_exception(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (no such route, a method the route does not answer), with
    their headers: a 405 keeps the ``Allow`` that names the methods that are answered."""
    assert isinstance(exc, HTTPException)
    codes = {404: "not_found", 405: "method_not_allowed"}
    message = f"{request.method} {request.url.path}: {exc.detail}"
    allowed = (exc.headers or {}).get("Allow")
    if exc.status_code == 405 and allowed:
        message += f"; this path answers {allowed}"
    error = FitboxError(message)
    error.status = exc.status_code
    error.type = "invalid_request_error" if exc.status_code < 500 else "server_error"
    error.code = codes.get(exc.status_code, "http_error")
    return error_response(error, headers=exc.headers)


async def on_store_unavailable(request: Request, exc: Exception) -> Response:
    """A change the store could not keep: the client hears why and what frees it."""
    assert isinstance(exc, StoreUnavailable)
    error = StorageFailed(f"{exc.reason}; nothing was changed.")
    if not exc.full:
        error.status, error.code = 503, "storage_unavailable"
    return error_response(error)


async def on_client_gone(request: Request, exc: Exception) -> Response:
    """A client that went away before its body arrived (or was cut off for being slow:
    server/door/connections.py): nobody reads a reply, and it is no error of the box's."""
    return Response(status_code=499)


async def on_unexpected(request: Request, exc: Exception) -> Response:
    """A bug: the body says so, and ``Connection: close`` says the connection ends with it
    (the server closes it after an unhandled exception; a client that is not told would
    send its next request into a closed socket)."""
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    error = FitboxError(f"fitbox hit an internal error ({type(exc).__name__}); see its log")
    error.closes = True
    return error_response(error)
