"""A safetensors file's header, read and checked without reading its tensor data: every
tensor's dtype, shape and byte span, validated against the file's size (a truncated
download, overlapping spans, a hostile header are refused with the reason)."""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_HEADER_BYTES = 100 * 1024 * 1024
# Bits per element of every dtype the safetensors format names.
DTYPE_BITS: dict[str, int] = {
    "F64": 64,
    "I64": 64,
    "U64": 64,
    "C64": 64,
    "F32": 32,
    "I32": 32,
    "U32": 32,
    "F16": 16,
    "BF16": 16,
    "I16": 16,
    "U16": 16,
    "I8": 8,
    "U8": 8,
    "BOOL": 8,
    "F8_E4M3": 8,
    "F8_E5M2": 8,
    "F8_E8M0": 8,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "F4": 4,
}


class BadSafetensors(ValueError):
    """A safetensors file whose header cannot be trusted; ``reason`` says why."""

    def __init__(self, reason: str, path: Path | None = None) -> None:
        super().__init__(f"{path}: {reason}" if path is not None else reason)
        self.reason = reason
        self.path = path


@dataclass(frozen=True)
class SafetensorsTensor:
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    data_offsets: tuple[int, int]


@dataclass(frozen=True)
class SafetensorsHeader:
    path: Path
    tensors: dict[str, SafetensorsTensor]
    metadata: dict[str, str]
    data_bytes: int  # the data buffer after the header, as the file holds it

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


def is_count(value: object) -> bool:
    """A non-negative int that is not a bool: what a shape or an offset must be."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise BadSafetensors(f"header names {key!r} twice")
        out[key] = value
    return out


def _tensor(name: str, entry: object, data_bytes: int) -> SafetensorsTensor:
    if not isinstance(entry, dict):
        raise BadSafetensors(f"tensor {name!r} is {type(entry).__name__}, not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise BadSafetensors(f"tensor {name!r} has unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(is_count(d) for d in shape):
        raise BadSafetensors(f"tensor {name!r} shape {shape!r} is not a list of counts")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(is_count, offsets))):
        raise BadSafetensors(f"tensor {name!r} data_offsets {offsets!r} are not [begin, end]")
    begin, end = offsets
    bits = DTYPE_BITS[dtype] * math.prod(shape)
    if bits % 8:
        raise BadSafetensors(f"tensor {name!r} {dtype} {shape} is {bits} bits, not whole bytes")
    if end - begin != bits // 8:
        raise BadSafetensors(
            f"tensor {name!r} data_offsets span {end - begin} bytes but {dtype} {shape} "
            f"needs {bits // 8}"
        )
    if end > data_bytes:
        raise BadSafetensors(
            f"tensor {name!r} data_offsets [{begin}, {end}] run past the end of the file: "
            f"its data buffer holds {data_bytes} bytes (truncated download?)"
        )
    return SafetensorsTensor(dtype, tuple(shape), bits // 8, (begin, end))


def _parse_header(
    raw: bytes, data_bytes: int
) -> tuple[dict[str, SafetensorsTensor], dict[str, str]]:
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys)
    except BadSafetensors:
        raise
    except UnicodeDecodeError as e:
        raise BadSafetensors(f"header is not UTF-8 (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise BadSafetensors(f"header is not valid JSON: {e.msg} at byte {e.pos}") from None
    except (ValueError, RecursionError) as e:  # 5000-digit numbers, 10000-deep nesting
        raise BadSafetensors(f"header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise BadSafetensors(f"header is a JSON {type(header).__name__}, not an object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise BadSafetensors("__metadata__ is not an object of strings")
    tensors = {name: _tensor(name, entry, data_bytes) for name, entry in header.items()}
    last: tuple[str, SafetensorsTensor] | None = None  # the span reaching furthest so far
    for name, info in sorted(tensors.items(), key=lambda item: item[1].data_offsets):
        if info.nbytes == 0:
            continue
        if last is not None and info.data_offsets[0] < last[1].data_offsets[1]:
            raise BadSafetensors(
                f"tensors {last[0]!r} {list(last[1].data_offsets)} and {name!r} "
                f"{list(info.data_offsets)} overlap"
            )
        if last is None or info.data_offsets[1] > last[1].data_offsets[1]:
            last = (name, info)
    return tensors, metadata


def read_safetensors_header(path: str | Path) -> SafetensorsHeader:
    """The tensors a safetensors file declares, validated against its size; no data read."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            size = path.stat().st_size
            prefix = f.read(8)
            if len(prefix) < 8:
                raise BadSafetensors(f"file is {size} bytes, shorter than the 8-byte prefix", path)
            (n,) = struct.unpack("<Q", prefix)
            if n > MAX_HEADER_BYTES:
                raise BadSafetensors(f"header length {n} is absurd (over 100 MiB)", path)
            if 8 + n > size:
                raise BadSafetensors(
                    f"header length {n} runs past the end of the {size}-byte file", path
                )
            raw = f.read(n)
    except OSError as e:
        raise BadSafetensors(f"cannot read: {e.strerror or e}", path) from e
    try:
        tensors, metadata = _parse_header(raw, size - 8 - n)
    except BadSafetensors as e:
        raise BadSafetensors(e.reason, path) from None
    return SafetensorsHeader(path, tensors, metadata, size - 8 - n)
