"""An image's width and height from its first bytes, for the formats the door passes on
(PNG, JPEG, GIF, WebP: server/door/bodies.py checks their magic). Only the header is read; no
pixel is decoded. None when the bytes do not say (a truncated or odd file): the caller
then bounds the image without its size.

Sources: PNG IHDR (RFC 2083 §4.1.1), GIF logical screen descriptor (GIF89a §18), JPEG
SOFn segments (ITU T.81 B.2.2; stb_image reads the first SOF it meets), WebP ``VP8 ``
(RFC 6386 §9.1), ``VP8L`` (14-bit sizes minus one) and ``VP8X`` (24-bit canvas minus one).
"""

from __future__ import annotations

import struct

# JPEG markers that carry a frame header (baseline, progressive, lossless, arithmetic...)
_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
# JPEG markers without a length (standalone): TEM, RST0-7
_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})


def image_dims(data: bytes) -> tuple[int, int] | None:
    """(width, height) of a PNG, GIF, JPEG or WebP; None when its header does not say."""
    if data.startswith(b"\x89PNG\r\n\x1a\n") and data[12:16] == b"IHDR" and len(data) >= 24:
        return _positive(*struct.unpack(">II", data[16:24]))
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        return _positive(*struct.unpack("<HH", data[6:10]))
    if data.startswith(b"\xff\xd8"):
        return _jpeg(data)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _webp(data)
    return None


def _positive(width: int, height: int) -> tuple[int, int] | None:
    return (width, height) if width > 0 and height > 0 else None


def _jpeg(data: bytes) -> tuple[int, int] | None:
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill bytes before a marker
            at += 1
            continue
        if marker in _STANDALONE:
            at += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image, or scan data before any frame header
            return None
        (length,) = struct.unpack(">H", data[at + 2 : at + 4])
        if marker in _SOF:
            if at + 9 > len(data):
                return None
            height, width = struct.unpack(">HH", data[at + 5 : at + 9])
            return _positive(width, height)
        at += 2 + length
    return None


def _webp(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30 and data[23:26] == b"\x9d\x01\x2a":
        width, height = struct.unpack("<HH", data[26:30])
        return _positive(width & 0x3FFF, height & 0x3FFF)
    if chunk == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        (bits,) = struct.unpack("<I", data[21:25])
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X" and len(data) >= 30:
        width = int.from_bytes(data[24:27], "little") + 1
        height = int.from_bytes(data[27:30], "little") + 1
        return width, height
    return None
