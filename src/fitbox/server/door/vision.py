"""Images in a call's messages, checked before a model is placed: chat's ``image_url``
parts (also what ``/apply-template`` renders), and the same images in the Responses and
Messages shapes: llama-server reads them all, and fetches an http URL in any of them.

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
from collections.abc import Iterator
from typing import Any

from fitbox.errors import InvalidRequest
from fitbox.units import format_bytes

# what an image's first bytes are, for each format the engines decode (llama.cpp's stb_image
# and PIL both read these)
_MAGIC = {b"\x89PNG\r\n\x1a\n": "png", b"\xff\xd8\xff": "jpeg", b"GIF87a": "gif", b"GIF89a": "gif"}
# every route whose body llama-server reads images from (and fetches an http one for)
ROUTES = frozenset({"/v1/chat/completions", "/apply-template", "/v1/responses", "/v1/messages"})


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
        raise _too_large(where, (len(payload) // 4) * 3, limit, param)
    try:
        data = binascii.a2b_base64(payload, strict_mode=True)
    except binascii.Error as exc:
        raise _refuse(
            f"{where}: the data URL's base64 does not decode ({exc}).", "invalid_image", param
        ) from None
    if len(data) > limit:
        raise _too_large(where, len(data), limit, param)
    if not any(data.startswith(magic) for magic in _MAGIC) and not _is_webp(data):
        raise _refuse(
            f"{where}: the bytes are not a PNG, JPEG, GIF or WebP image (they start {data[:8]!r}).",
            "invalid_image",
            param,
        )
    return data


def _too_large(where: str, size: int, limit: int, param: str) -> InvalidRequest:
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
