"""How a knob's JSON value in the settings API (POST /v1/settings/box|pair|key, /v1/limits)
becomes its value: the parsers the settings table (fitbox.config) names as ``api``, each
raising ValueError with what it must be, which box/preferences.py puts beside the knob's
name and the value sent. Each parser also says, as a JSON schema (``schema``), what it takes:
/openapi.json declares each knob with it, so the document is as strict as the parser."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fitbox.core.types import Goal, Rung
from fitbox.units import SIZE_PATTERN, parse_size

REASONING_FIELDS = ("reasoning_content", "reasoning", "none")
ALL_RUNGS = tuple(r.value for r in Rung)
Parser = Callable[[Any], Any]
_SCHEMAS: dict[Parser, Callable[[], dict[str, Any]]] = {}


def _takes(schema: Callable[[], dict[str, Any]]) -> Callable[[Parser], Parser]:
    """Declare what ``parser`` takes; a callable, so a schema that reads another module
    (the K/V types) is made only when the document is."""

    def register(parser: Parser) -> Parser:
        _SCHEMAS[parser] = schema
        return parser

    return register


def schema(parser: Parser) -> dict[str, Any]:
    """What ``parser`` takes, as a JSON schema (OpenAPI 3.0); ``null`` too: it clears a knob
    (an enum lists it, as OpenAPI 3.0.3 asks; of alternatives, the first takes it)."""
    taken = _SCHEMAS[parser]()
    if "anyOf" in taken:
        first, *others = taken["anyOf"]
        return {"anyOf": [{**first, "nullable": True}, *others]}
    if "enum" in taken:
        taken["enum"] = [*taken["enum"], None]
    return {**taken, "nullable": True}


def _enum(values: tuple[str, ...]) -> dict[str, Any]:
    return {"type": "string", "enum": list(values)}


def _kv_types() -> dict[str, Any]:
    from fitbox.core.sizing import KV_TYPES

    return {"type": "array", "minItems": 1, "items": _enum(tuple(KV_TYPES))}


@_takes(lambda: {"type": "array", "minItems": 1, "items": _enum(ALL_RUNGS)})
def rungs(value: Any) -> list[str]:
    names = [str(v) for v in value] if isinstance(value, list) else None
    if not names or any(n not in ALL_RUNGS for n in names):
        raise ValueError(f"a list of rungs from {', '.join(ALL_RUNGS)}")
    return [r for r in ALL_RUNGS if r in names]  # ladder order, whatever order they came in


@_takes(lambda: _enum(tuple(g.value for g in Goal)))
def goal(value: Any) -> str:
    if value not in [g.value for g in Goal]:
        raise ValueError(f"one of {', '.join(g.value for g in Goal)}")
    return str(value)


@_takes(_kv_types)
def kv(value: Any) -> list[str]:
    from fitbox.core.sizing import KV_TYPES  # here: every command reads the table at start

    if (
        not isinstance(value, list)
        or not value
        or any(not isinstance(v, str) or v not in KV_TYPES for v in value)  # {} is unhashable
    ):
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

    bounds = {"minimum": low, "maximum": high}
    return _takes(lambda: {"type": "integer" if integer else "number", **bounds})(parse)


@_takes(lambda: {"type": "boolean"})
def flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("true or false")
    return value


@_takes(lambda: {"type": "string", "minLength": 1, "maxLength": 32})
def quant(value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > 32:
        raise ValueError("a quant name such as Q4_K_M")
    return value.upper()


@_takes(lambda: {"type": "string", "minLength": 1, "maxLength": 256})
def model_name(value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > 256:
        raise ValueError("a model name as GET /v1/models lists it")
    return value.strip()


@_takes(lambda: _enum(("eta", "smart", "fifo")))
def admission(value: Any) -> str:
    if value not in ("eta", "smart", "fifo"):
        raise ValueError("one of eta, smart, fifo")
    return str(value)


@_takes(lambda: _enum(REASONING_FIELDS))
def reasoning_field(value: Any) -> str:
    if value not in REASONING_FIELDS:
        raise ValueError(f"one of {', '.join(REASONING_FIELDS)}")
    return str(value)


@_takes(
    lambda: {
        "anyOf": [
            {"type": "string", "pattern": SIZE_PATTERN},
            {"type": "integer", "minimum": 1},
        ]
    }
)
def size(value: Any) -> int:
    if isinstance(value, str):
        return parse_size(value)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise ValueError("a size such as 8GiB, or a byte count")
