"""Every error a client sees is ``{"error": {"message", "type", "code", "param"}}``."""

from __future__ import annotations

import logging

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from fitbox.errors import FitboxError, StorageFailed
from fitbox.store.db import StoreUnavailable

log = logging.getLogger(__name__)


def error_response(error: FitboxError) -> JSONResponse:
    headers = {"x-should-retry": "true" if error.retry else "false"}
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


async def on_fitbox_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, FitboxError)
    return error_response(exc)


async def on_http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    codes = {404: "not_found", 405: "method_not_allowed"}
    error = FitboxError(
        f"{request.method} {request.url.path}: {exc.detail}",
    )
    error.status = exc.status_code
    error.type = "invalid_request_error" if exc.status_code < 500 else "server_error"
    error.code = codes.get(exc.status_code, "http_error")
    return error_response(error)


async def on_store_unavailable(request: Request, exc: Exception) -> Response:
    """A change the store could not keep: the client hears why and what frees it."""
    assert isinstance(exc, StoreUnavailable)
    error = StorageFailed(f"{exc.reason}; nothing was changed.")
    if not exc.full:
        error.status, error.code = 503, "storage_unavailable"
    return error_response(error)


async def on_unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    return error_response(
        FitboxError(f"fitbox hit an internal error ({type(exc).__name__}); see its log")
    )
