"""Vision-language folders: ``image_url`` parts decoded from data URLs into PIL images and
passed, with the text, through the folder's own processor and chat template.

The model is loaded with ``AutoModelForImageTextToText`` and its ``AutoProcessor`` (image
processor + tokenizer); the first forward pass takes the pixels, later ones only the new
token (the image is in the cache by then). fitbox has already refused non-data URLs and
images over its size limit; the pixel bound here stops a small file that decodes huge.
"""

from __future__ import annotations

import base64
import binascii
import io
from typing import Any

from .chat import BadRequest, Chat, Request

MAX_PIXELS = 64 << 20  # a decompression bomb (a few KB of PNG, gigapixels) is refused


def decode_image(url: str) -> Any:
    """A data URL's image, as RGB PIL."""
    from PIL import Image

    head, _, payload = url.partition(",")
    if not head.startswith("data:image/") or ";base64" not in head:
        raise BadRequest(
            "image URLs are never fetched by the engine; send the image inline "
            "as a data:image/<type>;base64,... URL",
            "messages",
        )
    try:
        data = base64.b64decode(payload, validate=True)
        Image.MAX_IMAGE_PIXELS = MAX_PIXELS
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            return image.convert("RGB")
    except (binascii.Error, OSError, Image.DecompressionBombError, ValueError) as exc:
        raise BadRequest(f"the image cannot be read: {exc}", "messages") from None


def vision_content(content: Any) -> list[dict[str, Any]]:
    """A message's content as the processor's chat template takes it: text and image parts,
    each image decoded (``{"type": "image", "image": <PIL>}``)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if content is None:
        return []
    if not isinstance(content, list):
        raise BadRequest("message content must be a string or a list of parts", "messages")
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            parts.append({"type": "text", "text": str(part.get("text", ""))})
        elif kind == "image_url":
            url = (part.get("image_url") or {}).get("url", "")
            parts.append({"type": "image", "image": decode_image(str(url))})
        else:
            raise BadRequest(
                f"a message part of type {kind!r} is not understood; use text and image_url parts",
                "messages",
            )
    return parts


class VisionChat(Chat):
    """A vision-language model and its processor: images join the prompt as the processor
    expands them (each image its number of image tokens), so ``prompt_n`` counts them."""

    def content(self, content: Any) -> Any:
        return vision_content(content)

    def __init__(self, model: Any, processor: Any, window: int, folder: Any = None) -> None:
        super().__init__(model, processor.tokenizer, window, folder)
        self.processor = processor
        self.dtype = next(model.parameters()).dtype

    def count(self, body: dict[str, Any]) -> int:
        raise NotImplementedError  # images: the processor's count, not made here yet

    def template(self) -> str | None:
        return getattr(self.processor, "chat_template", None)

    def prompt(self, gen: Request) -> tuple[Any, dict[str, Any]]:
        if not self.template():
            raise BadRequest(
                "this model's folder has no chat template for its processor (chat_template.json)"
            )
        images = [p["image"] for m in gen.messages for p in m["content"] if p["type"] == "image"]
        plain = [
            m
            | {"content": [{"type": "image"} if p["type"] == "image" else p for p in m["content"]]}
            for m in gen.messages
        ]
        text = self.processor.apply_chat_template(
            plain, tools=gen.tools, tokenize=False, add_generation_prompt=True
        )
        inputs = self.processor(text=[text], images=images or None, return_tensors="pt")
        ids = self.bounded(inputs.pop("input_ids"))
        inputs.pop("attention_mask", None)  # one sequence, no padding: all ones
        extra = {}
        for key, value in inputs.items():
            value = value.to(self.device)
            extra[key] = value.to(self.dtype) if value.is_floating_point() else value
        return ids, extra
