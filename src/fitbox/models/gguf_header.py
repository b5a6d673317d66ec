"""Read a GGUF file's header (metadata and tensor table) without touching tensor data.

gguf's own GGUFReader decodes every token string into numpy views, which takes seconds on
a real tokenizer; placement needs only the scalars and the tensor table, so this reader
walks the header with ``struct`` and keeps large arrays as their length. The format is
gguf-py's ``gguf/constants.py`` (GGUFValueType) and llama.cpp's ``ggml/include/gguf.h``.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

MAGIC = b"GGUF"
KEEP_ARRAY_ITEMS = 4096  # per-layer arrays are kept; vocabularies are not
DEFAULT_ALIGNMENT = 32  # gguf.h GGUF_DEFAULT_ALIGNMENT; a file may set general.alignment
# ggml types newer than the gguf package: id -> (name, block size, bytes per block), from
# ggml/include/ggml.h and ggml/src/ggml-common.h of the build fitbox runs.
EXTRA_TYPES: dict[int, tuple[str, int, int]] = {42: ("Q2_0", 64, 18)}  # block_q2_0

_SCALARS: dict[int, str] = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")


class NotGGUF(ValueError):
    """The file does not start with the GGUF magic, or its header is cut short."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order, ne0 first
    type: int
    n_bytes: int
    offset: int = 0  # where its data starts in the file (the engine maps from here)


@dataclass(frozen=True)
class ArrayLength:
    """Stands in for an array too long to keep (a vocabulary, merges)."""

    length: int


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    fields: dict[str, Any]
    tensors: tuple[TensorInfo, ...]

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)


def has_gguf_magic(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


def type_name(type_id: int) -> str:
    """The ggml type's name as gguf spells it ("Q4_K", "F32"), also for newer types."""
    if type_id in EXTRA_TYPES:
        return EXTRA_TYPES[type_id][0]
    return GGMLQuantizationType(type_id).name


def tensor_bytes(type_id: int, shape: tuple[int, ...]) -> int:
    if type_id in EXTRA_TYPES:
        _, block, size = EXTRA_TYPES[type_id]
    else:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]
    n_elements = 1
    for dim in shape:
        n_elements *= dim
    return n_elements // block * size


class _Cursor:
    def __init__(self, buf: mmap.mmap) -> None:
        self.buf = buf
        self.pos = 0

    def unpack(self, fmt: str) -> Any:
        try:
            (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        except struct.error as exc:
            raise NotGGUF(f"header cut short at byte {self.pos}") from exc
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.unpack("<Q")
        if self.pos + length > len(self.buf):
            raise NotGGUF(f"string of {length} bytes runs past the end at byte {self.pos}")
        raw = self.buf[self.pos : self.pos + length]
        self.pos += length
        return raw.decode("utf-8", errors="replace")

    def value(self, type_id: int) -> Any:
        if type_id in _SCALARS:
            return self.unpack(_SCALARS[type_id])
        if type_id == _STRING:
            return self.string()
        if type_id == _ARRAY:
            item_type = self.unpack("<I")
            count = self.unpack("<Q")
            if count > KEEP_ARRAY_ITEMS:
                self._skip_array(item_type, count)
                return ArrayLength(count)
            return [self.value(item_type) for _ in range(count)]
        raise NotGGUF(f"unknown value type {type_id} at byte {self.pos}")

    def _skip_array(self, item_type: int, count: int) -> None:
        if item_type in _SCALARS:
            self.pos += struct.calcsize(_SCALARS[item_type]) * count
        elif item_type == _STRING:  # a vocabulary: the hot loop of catalog scans
            unpack, buf, pos = _U64.unpack_from, self.buf, self.pos
            try:
                for _ in range(count):
                    pos += 8 + unpack(buf, pos)[0]
            except struct.error as exc:
                raise NotGGUF(f"string array runs past the end at byte {pos}") from exc
            self.pos = pos
        else:
            for _ in range(count):
                self.value(item_type)


def read_header(path: Path) -> GGUFHeader:
    with path.open("rb") as f:
        try:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError as exc:  # an empty file cannot be mapped
            raise NotGGUF(f"{path} is empty") from exc
    with buf:
        if buf[:4] != MAGIC:
            raise NotGGUF(f"{path} does not start with the GGUF magic")
        cur = _Cursor(buf)
        cur.pos = 4
        version = cur.unpack("<I")
        if version < 2:
            raise NotGGUF(f"{path} is GGUF v{version}; only v2 and later are read")
        n_tensors = cur.unpack("<Q")
        n_fields = cur.unpack("<Q")
        fields: dict[str, Any] = {}
        for _ in range(n_fields):
            key = cur.string()
            fields[key] = cur.value(cur.unpack("<I"))
        tensors = []
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.unpack("<I")
            shape = tuple(cur.unpack("<Q") for _ in range(n_dims))
            type_id = cur.unpack("<I")
            offset = cur.unpack("<Q")  # relative to the data section
            try:
                n_bytes = tensor_bytes(type_id, shape)
            except (ValueError, KeyError) as exc:
                raise NotGGUF(f"tensor {name} has unknown type {type_id}") from exc
            tensors.append(TensorInfo(name, shape, type_id, n_bytes, offset))
        align = fields.get("general.alignment", DEFAULT_ALIGNMENT)
        align = align if isinstance(align, int) and align > 0 else DEFAULT_ALIGNMENT
        data = (cur.pos + align - 1) // align * align  # gguf.cpp: the data section is aligned
        placed = tuple(replace(t, offset=data + t.offset) for t in tensors)
        return GGUFHeader(version=version, fields=fields, tensors=placed)
