"""The one parser of JSON request bodies: every route that takes a body reads it here, so
every bad body gets the same clear 4xx.

A body is bounded (``FITBOX_MAX_BODY``): a declared ``Content-Length`` over the limit is
refused before a byte is read, and a chunked upload as soon as it passes the limit.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from fitbox.errors import BodyTooLarge, InvalidRequest
from fitbox.units import format_bytes

Kinds = dict[str, type | tuple[type, ...]]


def _too_large(said: str, limit: int) -> BodyTooLarge:
    return BodyTooLarge(
        f"The request body {said}; this box reads at most {format_bytes(limit)} "
        "(FITBOX_MAX_BODY). Send a smaller body, or raise FITBOX_MAX_BODY on the box."
    )


async def read_body(request: Request) -> bytes:
    """The whole body, refused (413) once it is known to be over the box's limit."""
    limit: int = request.app.state.config.max_body
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and (len(declared) > 18 or int(declared) > limit):
        raise _too_large(f"is {declared} bytes (Content-Length)", limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large("grew past the limit while it was read", limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def json_body(
    request: Request, required: Kinds | None = None, *, empty: bool = False
) -> tuple[bytes, dict[str, Any]]:
    """The raw bytes and the parsed object of a body that must be a JSON object, with each
    ``required`` field present, of its type, and (for strings) not empty. ``empty``: no
    body at all reads as ``{}``."""
    raw = await read_body(request)
    try:
        body = json.loads(raw or (b"{}" if empty else raw))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"The request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    for field, kind in (required or {}).items():
        if field not in body:
            raise InvalidRequest(f"Missing required field '{field}'.", param=field)
        if not isinstance(body[field], kind) or (
            isinstance(kind, type) and kind is str and not body[field]
        ):
            raise InvalidRequest(f"Field '{field}' has the wrong type or is empty.", param=field)
    return raw, body
