"""What scout hands back: hints (a path and what led to it) and findings (a hint whose
header was read). A hint never makes a file servable; only its GGUF header does."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fitbox.models.gguf_facts import read_facts
from fitbox.models.gguf_header import NotGGUF

LIVE, HISTORICAL = "live", "historical"


@dataclass(frozen=True)
class Limits:
    max_depth: int = 6  # directories below a root
    max_dirs: int = 20_000  # directories listed, all roots together
    max_results: int = 500  # findings kept


@dataclass(frozen=True)
class Hint:
    path: Path
    source: str  # root | hf_cache | ollama | lmstudio | process | store
    led_by: str  # for a person: "manifest registry.ollama.ai/library/tiny:latest"
    evidence: str = LIVE
    name: str | None = None  # a name the source gives it (an Ollama tag), if any


@dataclass(frozen=True)
class Finding:
    path: str
    name: str | None
    bytes: int | None
    source: str
    evidence: str
    led_by: str
    servable: bool
    detail: str

    def public(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Tally:
    """What the walk did, so its bounds can be checked by counts rather than by time."""

    dirs_visited: int = 0
    beyond_depth: int = 0  # directories not entered: deeper than max_depth
    dirs_left: bool = False  # max_dirs reached: some directories were never listed
    results_left: int = 0  # findings past max_results, dropped
    automounts_skipped: list[str] = field(default_factory=list)
    unreadable: int = 0

    def public(self) -> dict[str, Any]:
        return asdict(self)


def examine(hint: Hint) -> Finding:
    """Read the hinted file's GGUF header: servable only if it reads and can be sized."""
    name = hint.name or hint.path.name.removesuffix(".gguf")
    try:
        size: int | None = os.stat(hint.path).st_size
    except OSError as exc:
        return Finding(
            str(hint.path),
            name,
            None,
            hint.source,
            hint.evidence,
            hint.led_by,
            False,
            f"not readable: {exc.strerror or exc}",
        )
    try:
        facts = read_facts(hint.path)
    except (NotGGUF, OSError, ValueError) as exc:
        return Finding(
            str(hint.path),
            name,
            size,
            hint.source,
            hint.evidence,
            hint.led_by,
            False,
            f"not a readable GGUF: {exc}",
        )
    if facts.is_projector:
        why, ok = "a vision projector (mmproj), not a model", False
    elif facts.unknown_architecture:
        why, ok = f"architecture {facts.architecture!r} cannot be sized", False
    else:
        why, ok = f"GGUF {facts.architecture} {facts.quant}", True
    return Finding(str(hint.path), name, size, hint.source, hint.evidence, hint.led_by, ok, why)
