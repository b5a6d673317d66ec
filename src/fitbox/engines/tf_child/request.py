"""A chat call's body read into what the decode loop does, every field checked by name.

What the child cannot do is refused naming the field (``BadRequest.param``); a value of the
wrong type is refused as OpenAI refuses it, never with Python's own message. Sampling fields
the call leaves out take the folder's ``generation_config.json`` (what its authors tuned),
then OpenAI's defaults. ``max_tokens: 0`` is one token, as llama-server answers it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .refusal import BadRequest
from .tools import read_response_format, read_tools

__all__ = ["BadRequest", "Request", "Sampling", "folder_defaults", "read"]


MAX_N = 16  # choices made side by side in one batch: each is a row of the cache
MAX_TOP_LOGPROBS = 20  # OpenAI's bound
# Fields no transformers child does: refused by name, never answered as if honoured.
REFUSED = {
    "audio": "this engine makes text only; leave out 'audio'",
    "prediction": "predicted outputs are not used by this engine; leave out 'prediction'",
    "web_search_options": "this engine does not search the web",
    "functions": "the legacy 'functions' field is not read; send them as 'tools'",
    "function_call": "the legacy 'function_call' field is not read; use 'tool_choice'",
    "suffix": "this engine does not fill in the middle; leave out 'suffix'",
}


@dataclass
class Sampling:
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0
    repetition_penalty: float = 1.0  # transformers' (prompt and output tokens)
    presence_penalty: float = 0.0  # OpenAI's (output tokens)
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = None


@dataclass
class Request:
    """What one chat call asked for."""

    messages: list[dict[str, Any]]
    max_tokens: int  # -1: up to the window
    sampling: Sampling
    stop: tuple[str, ...] = ()
    n: int = 1
    logprobs: bool = False
    top_logprobs: int = 0
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] = "auto"  # auto, none, required, or one tool named
    response_format: dict[str, Any] | None = None  # json_object / json_schema
    stream: bool = False

    @property
    def forced_tool(self) -> str | None:
        """The tool a named tool_choice forces, else None."""
        if isinstance(self.tool_choice, dict):
            return str(self.tool_choice["function"]["name"])
        return None


def _number(body: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"'{name}' must be a number (got {json.dumps(value)})", name)
    if not low <= value <= high:
        raise BadRequest(f"'{name}' must be between {low:g} and {high:g} (got {value})", name)
    return float(value)


def _integer(body: dict[str, Any], name: str, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{name}' must be an integer (got {json.dumps(value)})", name)
    if not low <= value <= high:
        raise BadRequest(f"'{name}' must be between {low} and {high} (got {value})", name)
    return value


def folder_defaults(folder: Path) -> dict[str, Any]:
    """The sampling fields the folder's generation_config.json sets (not transformers' class
    defaults: a field the file leaves out is OpenAI's default)."""
    try:
        said = json.loads((folder / "generation_config.json").read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(said, dict):
        return {}
    keep = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
    found = {k: said[k] for k in keep if isinstance(said.get(k), int | float)}
    if said.get("do_sample") is False:
        found["temperature"] = 0.0  # the folder asks for greedy decoding
    return found


def sampling(body: dict[str, Any], defaults: dict[str, Any]) -> Sampling:
    """The request's sampling fields, each left out taken from the folder's defaults."""

    def pick(name: str, value: float | None, default: float) -> float:
        return value if value is not None else float(defaults.get(name, default))

    bias = body.get("logit_bias") or {}
    if not isinstance(bias, dict):
        raise BadRequest("'logit_bias' must map token ids to numbers", "logit_bias")
    try:
        logit_bias = {int(k): float(v) for k, v in bias.items() if -100 <= float(v) <= 100}
    except (TypeError, ValueError):
        raise BadRequest("'logit_bias' must map token ids to numbers", "logit_bias") from None
    if len(logit_bias) != len(bias):
        raise BadRequest("each 'logit_bias' value must be between -100 and 100", "logit_bias")
    top_k = _integer(body, "top_k", 0, 1 << 20)
    return Sampling(
        temperature=pick("temperature", _number(body, "temperature", 0, 2), 1.0),
        top_p=pick("top_p", _number(body, "top_p", 0, 1), 1.0),
        top_k=int(top_k if top_k is not None else defaults.get("top_k", 0)),
        min_p=pick("min_p", _number(body, "min_p", 0, 1), 0.0),
        repetition_penalty=pick(
            "repetition_penalty", _number(body, "repetition_penalty", 0.01, 10), 1.0
        ),
        presence_penalty=_number(body, "presence_penalty", -2, 2) or 0.0,
        frequency_penalty=_number(body, "frequency_penalty", -2, 2) or 0.0,
        logit_bias=logit_bias,
        seed=_integer(body, "seed", -(1 << 63), (1 << 64) - 1),
    )


def _max_tokens(body: dict[str, Any]) -> int:
    """-1 (or none given): up to the window; 0 is one token, as llama-server makes it."""
    name = (
        "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    )
    value = _integer(body, name, -1, 1 << 31)
    return -1 if value is None or value == -1 else max(value, 1)


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,) if stop else ()
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop) or len(stop) > 4:
        raise BadRequest("'stop' must be a string or a list of up to 4 strings", "stop")
    return tuple(s for s in stop if s)


def read(body: dict[str, Any], content: Callable[[Any], Any], defaults: dict[str, Any]) -> Request:
    """The chat call in ``body``; ``content`` reads one message's content (text, or images)."""
    for name, why in REFUSED.items():
        if body.get(name) is not None:
            raise BadRequest(why, name)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list", "messages")
    plain = [_message(m, content) for m in messages]
    logprobs = body.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise BadRequest("'logprobs' must be true or false", "logprobs")
    top = _integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top and not logprobs:
        raise BadRequest("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest("'stream' must be true or false", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequest("'stream_options' must be an object", "stream_options")
    tools, choice = read_tools(body)
    return Request(
        messages=plain,
        max_tokens=_max_tokens(body),
        sampling=sampling(body, defaults),
        stop=_stop(body),
        n=_integer(body, "n", 1, MAX_N) or 1,
        logprobs=bool(logprobs),
        top_logprobs=top or 0,
        tools=tools,
        tool_choice=choice,
        response_format=read_response_format(body),
        stream=bool(stream),
    )


def _message(message: Any, content: Callable[[Any], Any]) -> dict[str, Any]:
    """One message as the chat template takes it: its content read, an assistant's tool
    calls with their arguments as objects (the templates print them), a tool's reply."""
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise BadRequest("every message needs a 'role'", "messages")
    plain: dict[str, Any] = {"role": message["role"], "content": content(message.get("content"))}
    calls = message.get("tool_calls")
    if calls:
        if not isinstance(calls, list):
            raise BadRequest("an assistant message's 'tool_calls' must be a list", "messages")
        plain["tool_calls"] = [_past_call(c) for c in calls]
    for key in ("tool_call_id", "name"):
        if isinstance(message.get(key), str):
            plain[key] = message[key]
    return plain


def _past_call(call: Any) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise BadRequest("each tool call needs a function with a name", "messages")
    arguments = function.get("arguments") or "{}"
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        parsed = arguments  # the template prints it as given
    return {
        "id": call.get("id"),
        "type": "function",
        "function": {"name": function["name"], "arguments": parsed},
    }
