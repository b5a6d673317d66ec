"""A GGUF's chat template, read from its header: how many bytes one pass of it can emit
of its own (the prompt-token bound's input, core/prompts.py).

A statement (``{% for %}``, ``{% if %}``) and a comment emit nothing themselves, so only
the text between tags, every ``{{ expression }}`` (whatever it holds is at most as long
as the expression, or a value of the request, counted apart) and the string literals a
statement holds (``{% set greeting = '...' %}`` emitted later) are counted.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from .gguf_header import NotGGUF, read_header

TEMPLATE_KEY = "tokenizer.chat_template"
_STATEMENT = re.compile(r"\{%.*?%\}|\{#.*?#\}", re.S)
_LITERAL = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"", re.S)


def emitted_bytes(template: str) -> int:
    """Bytes one pass of ``template`` can emit of its own text (see the module's note)."""
    literals = sum(
        len(m.group().encode())
        for s in _STATEMENT.finditer(template)
        for m in _LITERAL.finditer(s.group())
    )
    return len(_STATEMENT.sub("", template).encode()) + literals


@lru_cache(maxsize=64)
def _template_bytes(path: Path, size: int, mtime_ns: int) -> int:
    try:
        template = read_header(path).fields.get(TEMPLATE_KEY)
    except (OSError, NotGGUF):
        return 0
    return emitted_bytes(template) if isinstance(template, str) else 0


def chat_template_bytes(path: Path) -> int:
    """What one pass of the file's chat template emits of its own, in bytes; 0 when it has
    none (or is not a GGUF)."""
    try:
        stat = path.stat()
    except OSError:
        return 0
    return _template_bytes(path, stat.st_size, stat.st_mtime_ns)
