"""What a GGUF model is, as placement needs it: its shape, from the header alone."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from fitbox.core.sizing import ModelShape
from fitbox.models.gguf_header import ArrayLength, GGUFHeader, read_header

# Architectures whose GGUF files are projectors (vision/audio encoders), never models.
PROJECTOR_ARCHES = frozenset({"clip", "mmproj"})
# Encoder architectures served through /v1/embeddings (llama-server --embeddings).
EMBEDDING_ARCHES = frozenset(
    {"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "modern-bert", "neo-bert", "t5encoder"}
)


@dataclass(frozen=True)
class GGUFFacts:
    path: Path
    architecture: str
    name: str
    file_type: int | None
    is_projector: bool
    is_embedding: bool
    shape: ModelShape


def _int(header: GGUFHeader, key: str, default: int = 0) -> int:
    value = header.get(key, default)
    return int(value) if isinstance(value, int | float | bool) else default


def _per_layer(header: GGUFHeader, key: str, n_layer: int, default: int) -> tuple[int, ...]:
    value = header.get(key)
    if isinstance(value, list):
        return tuple(int(v) for v in value[:n_layer])
    if isinstance(value, int):
        return (value,) * n_layer
    return (default,) * n_layer


def facts_from_header(path: Path, header: GGUFHeader) -> GGUFFacts:
    arch = str(header.get("general.architecture", "unknown"))
    n_layer = _int(header, f"{arch}.block_count")
    n_embd = _int(header, f"{arch}.embedding_length")
    heads = _per_layer(header, f"{arch}.attention.head_count", n_layer, 0)
    n_head = max(heads, default=0)
    kv_heads = (
        _per_layer(header, f"{arch}.attention.head_count_kv", n_layer, 0)
        if f"{arch}.attention.head_count_kv" in header.fields
        else heads
    )
    head_dim = n_embd // n_head if n_head else 0
    tokens = header.get("tokenizer.ggml.tokens")
    n_vocab = _int(header, f"{arch}.vocab_size") or (
        tokens.length if isinstance(tokens, ArrayLength) else len(tokens or [])
    )
    shape = ModelShape(
        weights_bytes=sum(t.n_bytes for t in header.tensors),
        n_layer=n_layer,
        n_ctx_train=_int(header, f"{arch}.context_length"),
        n_embd=n_embd,
        n_vocab=n_vocab,
        n_head=n_head,
        kv_heads=kv_heads,
        key_length=_int(header, f"{arch}.attention.key_length", head_dim),
        value_length=_int(header, f"{arch}.attention.value_length", head_dim),
    )
    file_type = header.get("general.file_type")
    return GGUFFacts(
        path=path,
        architecture=arch,
        name=str(header.get("general.name", path.stem)),
        file_type=int(file_type) if isinstance(file_type, int) else None,
        is_projector=arch in PROJECTOR_ARCHES,
        is_embedding=arch in EMBEDDING_ARCHES or f"{arch}.pooling_type" in header.fields,
        shape=shape,
    )


@lru_cache(maxsize=1024)
def _cached(path: Path, size: int, mtime_ns: int) -> GGUFFacts:
    return facts_from_header(path, read_header(path))


def read_facts(path: Path) -> GGUFFacts:
    """Facts for one file, cached by (path, size, mtime): a changed file is read again."""
    stat = path.stat()
    return _cached(path, stat.st_size, stat.st_mtime_ns)
