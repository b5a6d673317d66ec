"""Images in chat messages: ``image_url`` content parts, checked before a model is placed.

An image comes inline, as a ``data:image/…;base64,…`` URL. fitbox never fetches an
``http(s)`` URL on a client's behalf (the box would reach wherever a caller points it), so
those are refused with the fix: download it and send the bytes. Each image is decoded once
here to check it is bounded (``FITBOX_MAX_IMAGE``) and is a format the engines read (PNG,
JPEG, GIF, WebP, by its first bytes); the body is then forwarded as the client sent it. A
model that cannot read images gets ``model_not_vision_capable`` instead of an engine error.
"""

from __future__ import annotations

import binascii
from collections.abc import Iterator, Sequence
from typing import Any

from fitbox.errors import InvalidRequest
from fitbox.models.catalog import Artifact
from fitbox.units import format_bytes

# what an image's first bytes are, for each format the engines decode (llama.cpp's stb_image
# and PIL both read these)
_MAGIC = {b"\x89PNG\r\n\x1a\n": "png", b"\xff\xd8\xff": "jpeg", b"GIF87a": "gif",
          b"GIF89a": "gif"}  # fmt: skip
PARAM = "messages"


def _is_webp(data: bytes) -> bool:
    return data[:4] == b"RIFF" and data[8:12] == b"WEBP"


def image_urls(body: dict[str, Any]) -> Iterator[tuple[int, Any]]:
    """(message index, the part's ``image_url``) for every image part of a chat body."""
    messages = body.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else ()):
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else ():
            if isinstance(part, dict) and part.get("type") == "image_url":
                yield i, part.get("image_url")


def has_images(body: dict[str, Any]) -> bool:
    return next(image_urls(body), None) is not None


def _refuse(message: str, code: str) -> InvalidRequest:
    return InvalidRequest(message, param=PARAM, code=code)


def decode_data_url(url: str, where: str, limit: int) -> bytes:
    """The image bytes of a ``data:`` URL; InvalidRequest naming what is wrong."""
    head, comma, payload = url.partition(",")
    media = head.removeprefix("data:").split(";")
    if not comma or not media[0].startswith("image/") or "base64" not in media[1:]:
        raise _refuse(f"{where}: a data URL must read data:image/<type>;base64,<bytes> "
                      f"(it starts {head[:40]!r}).", "invalid_image_url")  # fmt: skip
    if (len(payload) // 4) * 3 > limit + 3:  # over the limit before decoding a byte of it
        raise _too_large(where, (len(payload) // 4) * 3, limit)
    try:
        data = binascii.a2b_base64(payload, strict_mode=True)
    except binascii.Error as exc:
        raise _refuse(f"{where}: the data URL's base64 does not decode ({exc}).",
                      "invalid_image") from None  # fmt: skip
    if len(data) > limit:
        raise _too_large(where, len(data), limit)
    if not any(data.startswith(magic) for magic in _MAGIC) and not _is_webp(data):
        raise _refuse(f"{where}: the bytes are not a PNG, JPEG, GIF or WebP image (they start "
                      f"{data[:8]!r}).", "invalid_image")  # fmt: skip
    return data


def _too_large(where: str, size: int, limit: int) -> InvalidRequest:
    return _refuse(f"{where}: the image is {format_bytes(size)}; this box takes at most "
                   f"{format_bytes(limit)} per image (FITBOX_MAX_IMAGE). Send it smaller "
                   "(scale or recompress it).", "image_too_large")  # fmt: skip


def check_images(body: dict[str, Any], limit: int) -> int:
    """Refuse a chat body whose image parts fitbox cannot pass on; returns how many."""
    count = 0
    for i, image in image_urls(body):
        where = f"messages[{i}] image {count + 1}"
        url = image.get("url") if isinstance(image, dict) else None
        if not isinstance(url, str) or not url:
            raise _refuse(f"{where}: an image_url part needs {{\"image_url\": {{\"url\": "
                          "\"data:image/png;base64,...\"}}.", "invalid_image_url")  # fmt: skip
        scheme = url.partition(":")[0].lower()
        if scheme in ("http", "https"):
            raise _refuse(f"{where}: fitbox does not fetch image URLs on a caller's behalf; "
                          "download the image and send it inline as a data URL "
                          "(data:image/png;base64,...).", "image_url_not_fetched")  # fmt: skip
        if scheme != "data":
            raise _refuse(f"{where}: an image URL must be a data: URL "
                          f"(data:image/png;base64,...), not {scheme or 'a bare'}:.",
                          "invalid_image_url")  # fmt: skip
        decode_data_url(url, where, limit)
        count += 1
    return count


def check_vision(name: str, artifacts: Sequence[Artifact], body: dict[str, Any]) -> None:
    """A call with images on a model that cannot read them: refused, saying how a model
    comes to read images. A family some of whose variants read images and some not is
    refused too (the placement could choose a blind one), naming the variants to pin."""
    blind = [a for a in artifacts if not a.vision]
    if not blind or not has_images(body):
        return
    seeing = [a.name for a in artifacts if a.vision]
    if seeing:
        raise _refuse(f"Of the variants '{name}' stands for, only {', '.join(seeing)} read "
                      "images (a vision projector beside them); name one of those.",
                      "model_not_vision_capable")  # fmt: skip
    raise _refuse(
        f"'{name}' does not read images: it is neither a vision-language transformers "
        "folder nor a GGUF with a vision projector (mmproj*.gguf) beside it. Send text "
        "only, or name a vision model (GET /v1/models marks them \"vision\": true).",
        "model_not_vision_capable")  # fmt: skip
