"""A PNG decoder in the standard library (fitbox's venv has no PIL): enough to prove that a
file an image route returned decodes whole, what its size is, and what its pixels are.

It reads 8-bit RGB and RGBA images, not interlaced (what PIL writes for a diffusers
picture); every chunk's CRC is checked and every scanline unfiltered, so a truncated or
damaged file fails here rather than passing on its header alone.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

SIGNATURE = b"\x89PNG\r\n\x1a\n"
CHANNELS = {2: 3, 6: 4}  # colour type -> samples per pixel


class BadPng(ValueError):
    pass


@dataclass(frozen=True)
class Decoded:
    width: int
    height: int
    channels: int
    rows: list[bytes]  # unfiltered, ``width * channels`` bytes each

    def distinct_pixels(self) -> int:
        step = self.channels
        return len({row[i : i + step] for row in self.rows for i in range(0, len(row), step)})


def _chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    if not data.startswith(SIGNATURE):
        raise BadPng("no PNG signature")
    found, at = [], len(SIGNATURE)
    while at < len(data):
        if at + 8 > len(data):
            raise BadPng(f"a chunk header cut off at byte {at}")
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind = data[at + 4 : at + 8]
        body = data[at + 8 : at + 8 + length]
        crc = data[at + 8 + length : at + 12 + length]
        if len(body) != length or len(crc) != 4:
            raise BadPng(f"chunk {kind!r} cut off")
        if struct.unpack(">I", crc)[0] != zlib.crc32(kind + body):
            raise BadPng(f"chunk {kind!r} fails its CRC")
        found.append((kind, body))
        at += 12 + length
    if not found or found[0][0] != b"IHDR" or found[-1][0] != b"IEND":
        raise BadPng("no IHDR first or no IEND last")
    return found


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def _unfilter(kind: int, line: bytearray, prior: bytes, bpp: int) -> bytes:
    for i in range(len(line)):
        left = line[i - bpp] if i >= bpp else 0
        up = prior[i]
        corner = prior[i - bpp] if i >= bpp else 0
        predicted = (0, left, up, (left + up) // 2, _paeth(left, up, corner))[kind]
        line[i] = (line[i] + predicted) & 0xFF
    return bytes(line)


def decode(data: bytes) -> Decoded:
    chunks = _chunks(data)
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    if depth != 8 or colour not in CHANNELS or interlace:
        raise BadPng(f"depth {depth}, colour type {colour}, interlace {interlace}: not read here")
    bpp = CHANNELS[colour]
    raw = zlib.decompress(b"".join(body for kind, body in chunks if kind == b"IDAT"))
    stride = width * bpp
    if len(raw) != height * (stride + 1):
        raise BadPng(f"{len(raw)} bytes of scanlines for {width}x{height}")
    rows, prior = [], bytes(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind = raw[start]
        if kind > 4:
            raise BadPng(f"row {y} has filter {kind}")
        prior = _unfilter(kind, bytearray(raw[start + 1 : start + 1 + stride]), prior, bpp)
        rows.append(prior)
    return Decoded(width, height, bpp, rows)
