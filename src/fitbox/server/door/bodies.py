"""The one parser of JSON request bodies: every route that takes a body reads it here, so
every bad body gets the same clear 4xx.

A body is bounded (``FITBOX_MAX_BODY``): a declared ``Content-Length`` over the limit is
refused before a byte is read, and a chunked upload as soon as it passes the limit. What
Python's ``json`` would accept but nothing after it can use is refused here too: ``NaN``,
``Infinity`` and numbers that overflow to them, numbers too long to convert, nesting too
deep to parse, and lone UTF-16 surrogates (``"\\ud800"``), which no UTF-8 writer can encode.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from starlette.requests import Request

from fitbox.errors import BodyTooLarge, InvalidRequest
from fitbox.units import format_bytes

Kinds = dict[str, type | tuple[type, ...]]
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
MAX_DEPTH = 64  # levels of nesting a body may have: no OpenAI body needs a tenth of it, and
# where Python's parser gives up depends on how deep its caller's stack already is


class _NotFinite(ValueError):
    pass


def _constant(name: str) -> Any:
    raise _NotFinite(name)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(text)
    return value


def _has_lone_surrogate(value: Any) -> bool:
    """Any string (or key) in ``value`` holding a surrogate: a pair would have been joined
    into one character by the parser, so what is left is alone. Walked without recursion."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests more than ``limit`` containers deep. Walked without recursion."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        for child in children:
            if isinstance(child, dict | list):
                if depth + 1 > limit:
                    return True
                stack.append((child, depth + 1))
    return False


def parse_json(raw: bytes) -> Any:
    """``raw`` as JSON that fitbox, SQLite and an engine can all take; InvalidRequest if not."""
    try:
        text = raw.decode(json.detect_encoding(raw))  # strict: encoded surrogates fail here
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"The request body is not valid UTF-8: {exc}") from None
    try:
        value = json.loads(text, parse_constant=_constant, parse_float=_finite)
    except _NotFinite as exc:
        raise InvalidRequest(
            f"The request body holds the number {str(exc)[:40]}: JSON numbers "
            "must be finite (no NaN or Infinity)."
        ) from None
    except RecursionError:
        raise InvalidRequest(
            "The request body is nested too deeply to read (a few hundred "
            "levels at most); flatten it."
        ) from None
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"The request body is not valid JSON: {exc}") from None
    except ValueError as exc:  # an integer over Python's digit limit
        raise InvalidRequest(f"The request body holds a number fitbox cannot read: {exc}") from None
    if (
        text.count("[") + text.count("{") > MAX_DEPTH
        and isinstance(value, dict | list)
        and _deeper_than(value, MAX_DEPTH)
    ):  # the counts spare most bodies the walk
        raise InvalidRequest(
            f"The request body is nested more than {MAX_DEPTH} levels deep; flatten it."
        )
    if _ESCAPED_SURROGATE.search(text) and _has_lone_surrogate(value):
        raise InvalidRequest(
            "The request body holds a lone UTF-16 surrogate (an escape in "
            "\\ud800-\\udfff without its pair): send valid Unicode."
        )
    return value


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


async def json_object(request: Request, *, empty: bool = False) -> tuple[bytes, dict[str, Any]]:
    """The raw bytes and the parsed object of a body that must be a JSON object. ``empty``:
    no body at all reads as ``{}``."""
    raw = await read_body(request)
    body = parse_json(raw or (b"{}" if empty else raw))
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    return raw, body


def check_fields(body: dict[str, Any], required: Kinds) -> None:
    """Each ``required`` field present, of its type, and (for strings) not empty."""
    for field, kind in required.items():
        if field not in body:
            raise InvalidRequest(f"Missing required field '{field}'.", param=field)
        if not isinstance(body[field], kind) or (
            isinstance(kind, type) and kind is str and not body[field]
        ):
            raise InvalidRequest(f"Field '{field}' has the wrong type or is empty.", param=field)


async def json_body(
    request: Request, required: Kinds | None = None, *, empty: bool = False
) -> tuple[bytes, dict[str, Any]]:
    """``json_object()`` with ``check_fields()``: the raw bytes and the parsed object."""
    raw, body = await json_object(request, empty=empty)
    check_fields(body, required or {})
    return raw, body
