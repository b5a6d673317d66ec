"""The one parser of JSON request bodies: every route that takes a body reads it here, so
every bad body gets the same clear 4xx.

A body is bounded (``FITBOX_MAX_BODY``): a declared ``Content-Length`` over the limit is
refused before a byte is read, and a chunked upload as soon as it passes the limit. What
Python's ``json`` would accept but nothing after it can use is refused here too: ``NaN``,
``Infinity`` and numbers that overflow to them, numbers too long to convert, nesting too
deep to parse, and lone UTF-16 surrogates (``"\\ud800"``), which no UTF-8 writer can encode.

Images in a call's messages are checked here too, before a model is placed: chat's
``image_url`` parts (also what ``/apply-template`` renders), and the same images in the
Responses and Messages shapes: llama-server reads them all, and fetches an http URL in any
of them.

An image comes inline, as a ``data:image/…;base64,…`` URL. fitbox never fetches an
``http(s)`` URL on a client's behalf (the box would reach wherever a caller points it), so
those are refused with the fix: download it and send the bytes. Each image is decoded once
here to check it is bounded (``FITBOX_MAX_IMAGE``) and is a format the engines read (PNG,
JPEG, GIF, WebP, by its first bytes); the body is then forwarded as the client sent it. A
model that cannot read images gets ``model_not_vision_capable`` instead of an engine error
(box/serving.py ``check_vision``, told how many images ``check_images`` found).
"""

from __future__ import annotations

import binascii
import json
import math
import re
from collections.abc import Iterator
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


# what an image's first bytes are, for each format the engines decode (llama.cpp's stb_image
# and PIL both read these)
_MAGIC = {b"\x89PNG\r\n\x1a\n": "png", b"\xff\xd8\xff": "jpeg", b"GIF87a": "gif", b"GIF89a": "gif"}
# every route whose body llama-server reads images from (and fetches an http one for)
IMAGE_ROUTES = frozenset(
    {"/v1/chat/completions", "/apply-template", "/v1/responses", "/v1/messages"}
)


def _is_webp(data: bytes) -> bool:
    return data[:4] == b"RIFF" and data[8:12] == b"WEBP"


def _parts(items: Any, key: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(item index, part) for each dict part of each item's ``key`` list."""
    for i, item in enumerate(items if isinstance(items, list) else ()):
        content = item.get(key) if isinstance(item, dict) else None
        for part in content if isinstance(content, list) else ():
            if isinstance(part, dict):
                yield i, part


def images(path: str, body: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """(where, URL) for every image of a body, in each route's own shape: chat's
    ``image_url`` parts, the Responses API's ``input_image`` parts, Anthropic's ``image``
    blocks (a base64 source is turned into the data URL it stands for). llama-server
    fetches an http URL in any of them itself, so each is checked here."""
    if path in ("/v1/chat/completions", "/apply-template"):
        for i, part in _parts(body.get("messages"), "content"):
            if part.get("type") == "image_url":
                image = part.get("image_url")
                yield f"messages[{i}]", image.get("url") if isinstance(image, dict) else None
    elif path == "/v1/responses":
        for i, part in _parts(body.get("input"), "content"):
            if part.get("type") == "input_image":
                image = part.get("image_url")
                yield f"input[{i}]", image.get("url") if isinstance(image, dict) else image
    elif path == "/v1/messages":
        for i, part in _parts(body.get("messages"), "content"):
            if part.get("type") == "image":
                yield f"messages[{i}]", _source_url(part.get("source"))


def _source_url(source: Any) -> Any:
    """An Anthropic image source as a URL: ``base64`` as its data URL, ``url`` as given."""
    if not isinstance(source, dict):
        return None
    if source.get("type") == "base64":
        return f"data:{source.get('media_type')};base64,{source.get('data', '')}"
    return source.get("url") if source.get("type") == "url" else None


def _refuse(message: str, code: str, param: str = "messages") -> InvalidRequest:
    return InvalidRequest(message, param=param, code=code)


def decode_data_url(url: str, where: str, limit: int, param: str = "messages") -> bytes:
    """The image bytes of a ``data:`` URL; InvalidRequest naming what is wrong."""
    head, comma, payload = url.partition(",")
    media = head.removeprefix("data:").split(";")
    if not comma or not media[0].startswith("image/") or "base64" not in media[1:]:
        raise _refuse(
            f"{where}: a data URL must read data:image/<type>;base64,<bytes> "
            f"(it starts {head[:40]!r}).",
            "invalid_image_url",
            param,
        )
    if (len(payload) // 4) * 3 > limit + 3:  # over the limit before decoding a byte of it
        raise _image_too_large(where, (len(payload) // 4) * 3, limit, param)
    try:
        data = binascii.a2b_base64(payload, strict_mode=True)
    except binascii.Error as exc:
        raise _refuse(
            f"{where}: the data URL's base64 does not decode ({exc}).", "invalid_image", param
        ) from None
    if len(data) > limit:
        raise _image_too_large(where, len(data), limit, param)
    if not any(data.startswith(magic) for magic in _MAGIC) and not _is_webp(data):
        raise _refuse(
            f"{where}: the bytes are not a PNG, JPEG, GIF or WebP image (they start {data[:8]!r}).",
            "invalid_image",
            param,
        )
    return data


def _image_too_large(where: str, size: int, limit: int, param: str) -> InvalidRequest:
    return _refuse(
        f"{where}: the image is {format_bytes(size)}; this box takes at most "
        f"{format_bytes(limit)} per image (FITBOX_MAX_IMAGE). Send it smaller "
        "(scale or recompress it).",
        "image_too_large",
        param,
    )


def check_images(path: str, body: dict[str, Any], limit: int) -> int:
    """Refuse a body whose images fitbox cannot pass on; returns how many it holds."""
    count = 0
    for where, url in images(path, body):
        where = f"{where} image {count + 1}"
        param = where.partition("[")[0]
        if not isinstance(url, str) or not url:
            raise _refuse(
                f"{where}: an image needs its URL, inline as a data URL "
                "(data:image/png;base64,...); file ids are not kept here.",
                "invalid_image_url",
                param,
            )
        scheme = url.partition(":")[0].lower()
        if scheme in ("http", "https"):
            raise _refuse(
                f"{where}: fitbox does not fetch image URLs on a caller's behalf; "
                "download the image and send it inline as a data URL "
                "(data:image/png;base64,...).",
                "image_url_not_fetched",
                param,
            )
        if scheme != "data":
            raise _refuse(
                f"{where}: an image URL must be a data: URL "
                f"(data:image/png;base64,...), not {scheme or 'a bare'}:.",
                "invalid_image_url",
                param,
            )
        decode_data_url(url, where, limit, param)
        count += 1
    return count


def query_number(request: Request, name: str, default: float, low: float, high: float) -> float:
    """A query parameter read as a number within ``low..high`` (``default`` when absent),
    or a 400 naming it."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:  # a whole number exactly: as a float, 2**62 + 1 would pass for 2**62
        value = int(raw) if raw.isascii() and raw.lstrip("-").isdigit() else float(raw)
    except ValueError:
        raise InvalidRequest(f"Query parameter '{name}' must be a number.", param=name) from None
    if not low <= value <= high:
        raise InvalidRequest(
            f"Query parameter '{name}' must be within {low:g}..{high:g}.", param=name
        )
    return value
