"""The one parser of JSON request bodies: every route that takes a body reads it here, so
every bad body gets the same clear 400."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from fitbox.errors import InvalidRequest

Kinds = dict[str, type | tuple[type, ...]]


async def json_body(
    request: Request, required: Kinds | None = None, *, empty: bool = False
) -> tuple[bytes, dict[str, Any]]:
    """The raw bytes and the parsed object of a body that must be a JSON object, with each
    ``required`` field present, of its type, and (for strings) not empty. ``empty``: no
    body at all reads as ``{}``."""
    raw = await request.body()
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
