"""Images for the vision tests, written with the standard library (fitbox's venv has no PIL):
PNG is a signature, an IHDR chunk, zlib-compressed scanlines and an IEND chunk."""

from __future__ import annotations

import base64
import random
import struct
import zlib
from collections.abc import Callable

Pixel = tuple[int, int, int]


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(width: int, height: int, pixel: Callable[[int, int], Pixel]) -> bytes:
    """An 8-bit RGB PNG whose pixel (x, y) is ``pixel(x, y)``."""
    rows = b"".join(
        b"\x00" + b"".join(bytes(pixel(x, y)) for x in range(width)) for y in range(height)
    )
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(rows))
        + _chunk(b"IEND", b"")
    )


def noise(width: int, height: int, seed: int = 0) -> bytes:
    """A PNG of random pixels: it barely compresses, so its size is about 3 x its pixels."""
    rng = random.Random(seed)
    return png(
        width, height, lambda x, y: (rng.randrange(256), rng.randrange(256), rng.randrange(256))
    )


def data_url(image: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64," + base64.b64encode(image).decode()


RED = png(32, 32, lambda x, y: (255, 0, 0))
STRIPES = png(48, 40, lambda x, y: (x * 5 % 256, y * 6 % 256, (x * y) % 256))
