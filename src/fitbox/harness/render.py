"""Plain data (dicts, lists, strings, numbers, booleans) written as JSON, YAML or TOML.

fitbox's runtime has no YAML or TOML library, and needs none for this: what it writes is
its own small blocks. YAML is written in block style with every string double-quoted the
JSON way (a JSON string is a valid YAML double-quoted scalar), so no value is ever read back
as another type (``no`` as false, ``1e3`` as a number). TOML is written with its tables
after the top-level keys, and arrays of tables as ``[[name]]``; tests read both back with
PyYAML and tomllib.
"""

from __future__ import annotations

import datetime
import json
import re
from typing import Any

_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_TOML_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def to_json(data: Any) -> str:
    return json.dumps(data, indent=2) + "\n"


# --- YAML --------------------------------------------------------------------------------


def _yaml_key(key: str) -> str:
    return key if _PLAIN_KEY.match(key) else json.dumps(key)


def _yaml_scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    if isinstance(value, str):
        return json.dumps(value)
    raise TypeError(f"cannot write {type(value).__name__} as YAML")


def yaml_lines(data: Any, indent: int = 0) -> list[str]:
    """``data`` (a dict or list) as YAML block lines, indented by ``indent`` spaces."""
    pad = " " * indent
    lines: list[str] = []
    if isinstance(data, dict):
        for key, value in data.items():
            if isinstance(value, dict | list) and value:
                lines.append(f"{pad}{_yaml_key(str(key))}:")
                lines += yaml_lines(value, indent + 2)
            else:
                empty = "{}" if isinstance(value, dict) else "[]"
                text = empty if isinstance(value, dict | list) else _yaml_scalar(value)
                lines.append(f"{pad}{_yaml_key(str(key))}: {text}")
        return lines
    if isinstance(data, list):
        for item in data:
            if isinstance(item, dict | list) and item:
                inner = yaml_lines(item, indent + 2)
                lines.append(f"{pad}- {inner[0].lstrip()}")
                lines += inner[1:]
            else:
                lines.append(f"{pad}- {_yaml_scalar(item)}")
        return lines
    return [f"{pad}{_yaml_scalar(data)}"]


def to_yaml(data: Any) -> str:
    return "\n".join(yaml_lines(data)) + "\n"


# --- TOML --------------------------------------------------------------------------------


def _toml_key(key: str) -> str:
    return key if _TOML_BARE_KEY.match(key) else json.dumps(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value) if isinstance(value, float) else str(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string escapes as JSON does
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        inner = ", ".join(f"{_toml_key(str(k))} = {_toml_value(v)}" for k, v in value.items())
        return "{" + inner + "}"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _toml_table(data: dict[str, Any], path: list[str], out: list[str]) -> None:
    scalars = {k: v for k, v in data.items() if not isinstance(v, dict) and not _is_table_array(v)}
    header = bool(path) and (bool(scalars) or not any(isinstance(v, dict) for v in data.values()))
    if header:
        out.append(f"[{'.'.join(_toml_key(p) for p in path)}]")
    for key, value in scalars.items():
        out.append(f"{_toml_key(str(key))} = {_toml_value(value)}")
    if scalars or header:
        out.append("")
    for key, value in data.items():
        if isinstance(value, dict):
            _toml_table(value, [*path, str(key)], out)
        elif _is_table_array(value):
            for item in value:
                out.append(f"[[{'.'.join(_toml_key(p) for p in [*path, str(key)])}]]")
                _toml_array_item(item, out)


def _toml_array_item(item: dict[str, Any], out: list[str]) -> None:
    for key, value in item.items():  # a table or table array inside one is written inline
        out.append(f"{_toml_key(str(key))} = {_toml_value(value)}")
    out.append("")


def to_toml(data: dict[str, Any]) -> str:
    out: list[str] = []
    _toml_table(data, [], out)
    while out and out[-1] == "":
        out.pop()
    return "\n".join(out) + "\n"
