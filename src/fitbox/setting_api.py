"""How a knob's JSON value in the settings API (POST /v1/settings/box|pair|key, /v1/limits)
becomes its value: the parsers the settings table (fitbox.config) names as ``api``, each
raising ValueError with what it must be, which box/preferences.py puts beside the knob's
name and the value sent."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fitbox.core.types import Goal, Rung
from fitbox.units import parse_size

REASONING_FIELDS = ("reasoning_content", "reasoning", "none")
ALL_RUNGS = tuple(r.value for r in Rung)


def rungs(value: Any) -> list[str]:
    names = [str(v) for v in value] if isinstance(value, list) else None
    if not names or any(n not in ALL_RUNGS for n in names):
        raise ValueError(f"a list of rungs from {', '.join(ALL_RUNGS)}")
    return [r for r in ALL_RUNGS if r in names]  # ladder order, whatever order they came in


def goal(value: Any) -> str:
    if value not in [g.value for g in Goal]:
        raise ValueError(f"one of {', '.join(g.value for g in Goal)}")
    return str(value)


def kv(value: Any) -> list[str]:
    from fitbox.core.sizing import KV_TYPES  # here: every command reads the table at start

    if not isinstance(value, list) or not value or any(v not in KV_TYPES for v in value):
        raise ValueError(f"a list of cache types from {', '.join(KV_TYPES)}")
    return [str(v) for v in value]


def number(low: float, high: float, integer: bool = False) -> Callable[[Any], float | int]:
    def parse(value: Any) -> float | int:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError("a number")
        if not low <= value <= high:
            raise ValueError(f"between {low:g} and {high:g}")
        if integer and value != int(value):
            raise ValueError("a whole number")
        return int(value) if integer else float(value)

    return parse


def flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("true or false")
    return value


def quant(value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > 32:
        raise ValueError("a quant name such as Q4_K_M")
    return value.upper()


def admission(value: Any) -> str:
    if value not in ("eta", "smart", "fifo"):
        raise ValueError("one of eta, smart, fifo")
    return str(value)


def reasoning_field(value: Any) -> str:
    if value not in REASONING_FIELDS:
        raise ValueError(f"one of {', '.join(REASONING_FIELDS)}")
    return str(value)


def size(value: Any) -> int:
    if isinstance(value, str):
        return parse_size(value)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise ValueError("a size such as 8GiB, or a byte count")
