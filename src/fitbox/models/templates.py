"""A GGUF's chat template, read from its header (the prompt-token bound's input)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from .gguf_header import NotGGUF, read_header

TEMPLATE_KEY = "tokenizer.chat_template"


@lru_cache(maxsize=64)
def _template_bytes(path: Path, size: int, mtime_ns: int) -> int:
    try:
        template = read_header(path).fields.get(TEMPLATE_KEY)
    except (OSError, NotGGUF):
        return 0
    return len(template.encode("utf-8")) if isinstance(template, str) else 0


def chat_template_bytes(path: Path) -> int:
    """The template's length in bytes; 0 when the file has none (or is not a GGUF)."""
    try:
        stat = path.stat()
    except OSError:
        return 0
    return _template_bytes(path, stat.st_size, stat.st_mtime_ns)
