"""A bound on a call's prompt tokens that is never below what the model's own tokenizer
and chat template count, from the request alone (FORMULAS.md §Prompt tokens).

Every token of a byte-level BPE or an SPM vocabulary with byte fallback covers at least
one byte of the text it was cut from, so a text of B bytes is at most B tokens, plus the
specials the tokenizer adds (BOS, EOS; SPM's leading space is one more). The rendered
prompt is the chat template's own text, repeated at most once per message, per tool and
once more (its loops run over those), plus every value the request carries, which the
JSON body holds at no fewer bytes than it renders (escapes only lengthen).

An image is not rendered as its bytes: the engine puts its own tokens in its place. Given
the model's ``ImageTokens`` (core/image_tokens.py), an image's URL bytes leave the count and
its tokens join it; an image whose count is unknown keeps its bytes (a true bound still).
"""

from __future__ import annotations

import binascii
import json
from collections.abc import Iterator
from typing import Any

from fitbox.core.image_header import image_dims
from fitbox.core.image_tokens import ImageTokens

ADDED_TOKENS = 3  # BOS, EOS and SPM's dummy-prefix space, whichever the tokenizer adds
# A GGUF without a chat template is rendered with llama.cpp's chatml fallback:
# "<|im_start|>{role}\n{content}<|im_end|>\n" per message, "<|im_start|>assistant\n" once
CHATML_BYTES = 64
TOJSON_GROWTH = 3


def _bytes(value: Any) -> int:
    if isinstance(value, str):
        return len(value.encode("utf-8", errors="surrogatepass"))
    return len(json.dumps(value, ensure_ascii=False).encode("utf-8", errors="surrogatepass"))


def prompt_bound(
    body: dict[str, Any], template_bytes: int, images: ImageTokens | None = None
) -> int:
    """Tokens a body's prompt may take at most; 0 when it has none. A chat (``messages``,
    or a Responses ``input``) is rendered by the template from any of the body's values
    (a ``system``, ``instructions``, tools): the whole body's bytes count, an image's as
    the tokens it becomes when ``images`` says how many."""
    chat = body.get("messages", body.get("input"))
    if chat is not None and "prompt" not in body:
        tools = body.get("tools")
        items = (len(chat) if isinstance(chat, list) else 1) + (
            len(tools) if isinstance(tools, list) else 0
        )
        template = template_bytes or CHATML_BYTES
        # a template may render tools with tojson, which can escape a character into
        # \uXXXX: six bytes for every two or more the body holds
        values = _bytes(body) + ((TOJSON_GROWTH - 1) * _bytes(tools) if tools is not None else 0)
        if images is not None:
            values += sum(_image_change(payload, images) for payload in image_payloads(chat))
        return (items + 1) * template + values + ADDED_TOKENS
    prompt = body.get("prompt")
    if prompt is None:
        return 0
    return _bytes(prompt) + ADDED_TOKENS


def image_payloads(chat: Any) -> Iterator[str]:
    """The base64 text of each image in a chat's content parts, in every shape the door
    passes on (server/door/bodies.py ``images``): chat's ``image_url``, Responses'
    ``input_image``, Messages' ``image`` with a base64 source."""
    for item in chat if isinstance(chat, list) else ():
        content = item.get("content") if isinstance(item, dict) else None
        for part in content if isinstance(content, list) else ():
            if not isinstance(part, dict):
                continue
            kind = part.get("type")
            if kind in ("image_url", "input_image"):
                image = part.get("image_url")
                url = image.get("url") if isinstance(image, dict) else image
                if isinstance(url, str) and url.startswith("data:"):
                    yield url
            elif kind == "image" and isinstance(part.get("source"), dict):
                data = part["source"].get("data")
                if part["source"].get("type") == "base64" and isinstance(data, str):
                    yield data


def _image_change(payload: str, images: ImageTokens) -> int:
    """What one image adds to the byte count once bounded by its tokens: minus its URL's
    bytes, plus its tokens (0 when its tokens are unknown: its bytes stand)."""
    tokens = images.bound(None if images.fixed else _dims(payload))
    if tokens is None:
        return 0
    return tokens - len(payload.encode("utf-8", errors="surrogatepass"))


def _dims(payload: str) -> tuple[int, int] | None:
    data = payload.partition(",")[2] if payload.startswith("data:") else payload
    try:
        return image_dims(binascii.a2b_base64(data))
    except (binascii.Error, ValueError):
        return None
