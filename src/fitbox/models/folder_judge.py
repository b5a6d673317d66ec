"""Whether a transformers folder can be served, judged from its files before anything loads.

A folder whose safetensors headers price it may still fail once loaded, and a load evicts
what it displaces first. So the scan refuses, with the reason, a folder that:

- needs its own Python (``auto_map`` in config.json or tokenizer_config.json for a
  model type the engine's transformers does not know): fitbox never runs a folder's code;
- names an architecture the engine's transformers does not have (its list is captured from
  the engine environment, ``EngineSupport``; unknown until a probe wrote it: not judged);
- has no tokenizer (transformers would build a 5-token one and answer empty text);
- holds weights that are not numbers: a cheap sample (the first bytes of every floating
  tensor) finds NaN or infinity; what the sample misses the child refuses at run time.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from fitbox.models.safetensors_header import SafetensorsHeader

# Files any of which is a tokenizer transformers can load (fast, sentencepiece, BPE, WordPiece,
# tiktoken); merges.txt goes with vocab.json.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "vocab.json",
    "vocab.txt",
    "vocab.model",
    "tekken.json",
)
SAMPLE_BYTES = 32  # per floating tensor: one small read at the start of its data
# An exponent field of all ones is infinity or NaN, in each float format safetensors names.
NON_FINITE = {"F32": (4, "<I", 0x7F800000), "F16": (2, "<H", 0x7C00), "BF16": (2, "<H", 0x7F80)}
SUPPORT_FILE = "tf-capabilities.json"  # in fitbox's home, written by the engine's probe


@dataclass(frozen=True)
class EngineSupport:
    """What the engine environment's transformers loads: its model classes and config types."""

    transformers: str  # its version
    architectures: frozenset[str]
    model_types: frozenset[str]


def read_support(path: Path | None) -> EngineSupport | None:
    """The support a probe of the engine environment wrote, or None when none was."""
    if path is None:
        return None
    try:
        said = json.loads(path.read_bytes())
        return EngineSupport(
            str(said["transformers"]),
            frozenset(map(str, said["architectures"])),
            frozenset(map(str, said["model_types"])),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None  # not written yet, or by another version: nothing is judged by it


def judge(
    root: Path,
    config: dict[str, Any],
    headers: list[SafetensorsHeader],
    support: EngineSupport | None,
) -> str | None:
    """Why the folder ``root`` cannot be served, or None."""
    return (
        remote_code(root, config, support)
        or architecture(config, support)
        or tokenizer(root)
        or weights(headers)
    )


def _auto_map(root: Path, config: dict[str, Any]) -> str | None:
    """The file whose ``auto_map`` names the folder's own Python classes."""
    if isinstance(config.get("auto_map"), dict):
        return "config.json"
    try:
        tok = json.loads((root / "tokenizer_config.json").read_bytes())
    except (OSError, ValueError):
        return None
    return "tokenizer_config.json" if isinstance(tok, dict) and tok.get("auto_map") else None


def remote_code(root: Path, config: dict[str, Any], support: EngineSupport | None) -> str | None:
    named = _auto_map(root, config)
    if named is None:
        return None
    model_type = config.get("model_type")
    if support is not None and isinstance(model_type, str) and model_type in support.model_types:
        return None  # transformers has its own classes for it: the folder's code is not run
    return (
        f"it needs its own Python code ({named} has an auto_map; transformers would need "
        "trust_remote_code), which fitbox never runs: convert it to GGUF for llama-server, "
        "or use a folder of an architecture transformers ships"
    )


def architecture(config: dict[str, Any], support: EngineSupport | None) -> str | None:
    if support is None:
        return None
    archs = config.get("architectures")
    named = [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []
    model_type = config.get("model_type")
    if named and any(a in support.architectures for a in named):
        return None
    if not named and isinstance(model_type, str) and model_type in support.model_types:
        return None
    what = f"architecture {', '.join(named)}" if named else f"model_type {model_type!r}"
    return (
        f"{what} is unknown to transformers {support.transformers} in the engine "
        "environment: upgrade it (fitbox install --tf after a fitbox upgrade), or convert "
        "the model to GGUF for llama-server"
    )


def tokenizer(root: Path) -> str | None:
    places = [root]
    if (root / "modules.json").is_file():  # sentence-transformers may keep it in a module
        places += [p for p in root.iterdir() if p.is_dir()]
    for place in places:
        if any((place / name).is_file() for name in TOKENIZER_FILES):
            return None
        if any(place.glob("*.tiktoken")):
            return None
    return (
        "it has no tokenizer (none of tokenizer.json, tokenizer.model, vocab.json, "
        "vocab.txt, *.tiktoken): copy the tokenizer files of the model it was made from "
        "into the folder"
    )


def weights(headers: list[SafetensorsHeader]) -> str | None:
    for header in headers:
        st = header.path.stat()
        found = _sampled(header.path, st.st_size, st.st_mtime_ns, _spans(header))
        if found is not None:
            return (
                f"its weights are corrupt: tensor {found!r} in {header.path.name} holds "
                "NaN or infinity (a bad conversion or download): fetch the weights again"
            )
    return None


def _spans(header: SafetensorsHeader) -> tuple[tuple[str, str, int, int], ...]:
    """(name, dtype, file offset, bytes to read) of each floating tensor's first bytes."""
    start = header.path.stat().st_size - header.data_bytes
    return tuple(
        (name, t.dtype, start + t.data_offsets[0], min(t.nbytes, SAMPLE_BYTES))
        for name, t in sorted(header.tensors.items(), key=lambda i: i[1].data_offsets)
        if t.dtype in NON_FINITE and t.nbytes
    )


@lru_cache(maxsize=256)  # keyed by the file's size and mtime: a rescan reads nothing again
def _sampled(
    path: Path, size: int, mtime_ns: int, spans: tuple[tuple[str, str, int, int], ...]
) -> str | None:
    """The first tensor whose sampled bytes hold a non-finite number, or None."""
    with path.open("rb") as f:
        for name, dtype, offset, length in spans:
            f.seek(offset)
            if not _finite(dtype, f.read(length)):
                return name
    return None


def _finite(dtype: str, raw: bytes) -> bool:
    width, fmt, mask = NON_FINITE[dtype]
    count = len(raw) // width
    values = struct.unpack(f"<{count}{fmt[1]}", raw[: count * width])
    return all(v & mask != mask for v in values)
