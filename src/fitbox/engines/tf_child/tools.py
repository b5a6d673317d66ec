"""Tools and structured output: read from the call, handed to the chat template, parsed back.

A folder's chat template takes ``tools`` (``apply_chat_template(tools=...)``) and teaches
the model to answer a call as Hermes' and Qwen's templates do::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Those blocks are parsed back into OpenAI's ``tool_calls``. A template that takes no tools,
or writes calls another way, is refused by name: the call would be answered as plain text.
``tool_choice: required`` or a named tool, and ``response_format``, are grammars the decode
loop enforces (grammar.py); ``auto`` lets the model choose, and its blocks are parsed.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

from .refusal import BadRequest

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.DOTALL)


def read_tools(body: dict[str, Any]) -> tuple[list[dict[str, Any]] | None, Any]:
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if tools is None:
        if choice not in (None, "none"):
            raise BadRequest("'tool_choice' needs 'tools'", "tool_choice")
        return None, "none"
    if not isinstance(tools, list) or not tools:
        raise BadRequest("'tools' must be a non-empty list", "tools")
    names = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(tool, dict)
            or tool.get("type") != "function"
            or not isinstance(function, dict)
        ):
            raise BadRequest("each tool must be {'type': 'function', 'function': {...}}", "tools")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise BadRequest("each tool's function needs a 'name'", "tools")
        parameters = function.get("parameters", {})
        if not isinstance(parameters, dict):
            raise BadRequest(f"tool '{function['name']}': 'parameters' must be an object", "tools")
        names.append(function["name"])
    if choice is None:
        return tools, "auto"
    if choice in ("auto", "none", "required"):
        return tools, choice
    named = choice.get("function") if isinstance(choice, dict) else None
    if not isinstance(named, dict) or named.get("name") not in names:
        raise BadRequest(
            "'tool_choice' must be 'auto', 'none', 'required' or "
            f"{{'type': 'function', 'function': {{'name': one of {names}}}}}",
            "tool_choice",
        )
    return tools, choice


def read_response_format(body: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON a reply must be: None for text, else a JSON schema (any object for
    ``json_object``)."""
    fmt = body.get("response_format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise BadRequest(
                "'response_format.json_schema.schema' must be a JSON schema object",
                "response_format",
            )
        return schema
    raise BadRequest(
        "'response_format.type' must be 'text', 'json_object' or 'json_schema'", "response_format"
    )


def check_template(template: str | None) -> None:
    """Refused unless the folder's chat template hands tools to the model and writes calls
    as ``<tool_call>`` blocks (the only form parsed back)."""
    if not template or "tools" not in template:
        raise BadRequest(
            "this model's chat template takes no tools: its prompt would not show them. "
            "Leave out 'tools', or use a model whose template has them",
            "tools",
        )
    if OPEN not in template:
        raise BadRequest(
            "this model's chat template writes tool calls in a form this engine does not "
            f"parse back (it reads {OPEN}{{json}}{CLOSE} blocks, as Hermes and Qwen write them)",
            "tools",
        )


def call_schema(tools: list[dict[str, Any]], only: str | None) -> dict[str, Any]:
    """The JSON of one call block: one of the tools (or the one named), with its arguments."""
    shapes = []
    for tool in tools:
        function = tool["function"]
        if only is not None and function["name"] != only:
            continue
        parameters = function.get("parameters") or {"type": "object"}
        shapes.append(
            {
                "type": "object",
                "properties": {"name": {"const": function["name"]}, "arguments": parameters},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    return shapes[0] if len(shapes) == 1 else {"anyOf": shapes}


def parsed(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """The content outside the call blocks (None when nothing else was said), and the calls
    in OpenAI's shape; a block that is not a JSON call stays in the content as written."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    at = 0
    for match in _BLOCK.finditer(text):
        try:
            said = json.loads(match.group(1))
        except ValueError:
            continue
        if not isinstance(said, dict) or not isinstance(said.get("name"), str):
            continue
        arguments = said.get("arguments", said.get("parameters", {}))
        kept.append(text[at : match.start()])
        at = match.end()
        calls.append(
            {
                "id": "call_" + secrets.token_hex(12),
                "type": "function",
                "function": {
                    "name": said["name"],
                    "arguments": arguments
                    if isinstance(arguments, str)
                    else json.dumps(arguments, ensure_ascii=False),
                },
            }
        )
    if not calls:
        return text, []
    rest = ("".join(kept) + text[at:]).strip()
    return rest or None, calls
