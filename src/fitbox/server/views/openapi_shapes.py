"""The request bodies and parameters /openapi.json declares, each as strict as the check the
server makes of it and no stricter: a field the server requires is required here, a string it
refuses empty has ``minLength: 1``, a number has the bounds the handler enforces, a body whose
unknown fields are refused (the settings) has ``additionalProperties: false``, and a body the
server reads as ``{}`` when absent is not required. Lists the server owns (operator actions,
telemetry tables, settings and their parsers, K/V types) are read from it, never copied.
tests/test_contract_e2e.py holds the box to this document with schemathesis."""

from __future__ import annotations

from typing import Any

from fitbox.box.preferences import BOX_KNOBS, KEY_KNOBS, LIMIT_KNOBS, PAIR_KNOBS
from fitbox.core.sizing import KV_TYPES
from fitbox.server.manage.operate import ACTIONS
from fitbox.server.manage.settings import TIERS
from fitbox.server.manage.telemetry import MAX_ROWS, MAX_WAIT_S
from fitbox.server.views.openapi import path_param
from fitbox.setting_api import Parser, schema
from fitbox.store.db import CURSOR_TABLES, READING_TABLES
from fitbox.store.keys import SCOPES

NAME = {"type": "string", "minLength": 1}  # check_fields refuses an empty string
TEXT_OR_LIST = {"oneOf": [{"type": "string"}, {"type": "array"}]}
LIST = {"type": "array"}
LARGEST = 2**62  # the largest cursor or offset a telemetry reader may send


def body(required: dict[str, Any], optional: dict[str, Any] | None = None) -> dict[str, Any]:
    """An object with ``required`` fields and ``optional`` ones (others are passed on)."""
    return {
        "type": "object",
        "required": list(required),
        "properties": {**required, **(optional or {})},
    }


def closed(shape: dict[str, Any]) -> dict[str, Any]:
    """``shape`` with no other fields: its route refuses any other by name
    (``unsupported_field``), so the document says so."""
    return {**shape, "additionalProperties": False}


def query_param(name: str, shape: dict[str, Any], required: bool = False) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": required, "schema": shape}


def number(low: float, high: float) -> dict[str, Any]:
    """A query number the telemetry handlers read with float() and bound."""
    return {"type": "number", "minimum": low, "maximum": high}


MESSAGE_LIST = {"type": "array", "minItems": 1}  # [] is refused: no conversation to answer
CHAT = body(
    {"model": NAME, "messages": MESSAGE_LIST},
    {
        "stream": {"type": "boolean"},
        "max_tokens": {"type": "integer"},
        "metadata": {
            "type": "object",
            "properties": {
                "fitbox_progress": {
                    "type": "string",
                    "enum": ["true", "false"],
                    "description": "A stream that waits for a load gets progress chunks: "
                    "choices [] and fitbox_progress {state, queue_position, bytes_loaded, "
                    "bytes_total, seconds}",
                }
            },
        },
        "reasoning_format": {
            "type": "string",
            "enum": ["none"],
            "description": "none: the model's thinking stays in content",
        },
    },
)
REPLY = (
    "The reply. A model's thinking is in message.reasoning_content (delta. when "
    "streamed), or reasoning, or left in content: the key's reasoning_field setting, "
    "else the box's"
)
HELPER_CHAT = (
    "The model fitbox-helper is no weights: it answers with menus over this box (residents, "
    "why a model is refused, settings, set, config), placing nothing; only this route takes "
    "it (another route naming it is a 400 helper_chat_only)"
)
STREAMED = {"stream": {"type": "boolean"}, "max_tokens": {"type": "integer"}}
COMPLETION = body({"model": NAME, "prompt": TEXT_OR_LIST}, STREAMED)
EMBEDDING = body({"model": NAME, "input": TEXT_OR_LIST})
RESPONSES = body(
    {"model": NAME, "input": TEXT_OR_LIST},
    {"stream": {"type": "boolean"}, "max_output_tokens": {"type": "integer"}},
)
MESSAGES = body(
    {"model": NAME, "messages": MESSAGE_LIST, "max_tokens": {"type": "integer"}}, STREAMED
)
COUNT_TOKENS = body({"model": NAME, "messages": MESSAGE_LIST})
RERANK = body(
    {"model": NAME, "query": NAME, "documents": {"type": "array", "items": {"type": "string"}}}
)
TOKENIZE = body({"model": NAME, "content": TEXT_OR_LIST})
DETOKENIZE = body({"model": NAME, "tokens": LIST})
APPLY_TEMPLATE = body({"model": NAME, "messages": LIST})
INFILL = body({"model": NAME})  # the rest is llama-server's to read
TRANSCRIPTION = body(
    {"model": NAME, "file": {"type": "string", "format": "binary"}},
    {
        "language": {"type": "string"},
        "prompt": {"type": "string"},
        "temperature": {"type": "number", "minimum": 0, "maximum": 1},
        "response_format": {
            "type": "string",
            "enum": ["json", "text", "verbose_json", "srt", "vtt"],
        },
        "stream": {"type": "boolean"},
        "timestamp_granularities[]": {"type": "array", "items": {"enum": ["segment", "word"]}},
    },
)
TRANSLATION = body(
    {"model": NAME, "file": {"type": "string", "format": "binary"}},
    {
        k: v
        for k, v in TRANSCRIPTION["properties"].items()
        if k not in ("model", "file", "language")
    },
)
SPEECH = closed(
    body(
        {
            "model": NAME,
            "input": {"type": "string", "minLength": 1, "maxLength": 4096},
            "voice": NAME,
        },
        {
            "response_format": {"type": "string", "enum": ["wav", "pcm", "flac", "mp3", "opus"]},
            "speed": {"type": "number", "minimum": 0.25, "maximum": 4.0},
            "stream_format": {"type": "string", "enum": ["audio", "sse"]},
        },
    )
)
IMAGES = closed(
    body(
        {"model": NAME, "prompt": {"type": "string", "minLength": 1, "maxLength": 32000}},
        {
            "n": {"type": "integer", "minimum": 1, "maximum": 10},
            "size": {"type": "string", "description": "WIDTHxHEIGHT, or auto (the native size)"},
            "response_format": {"type": "string", "enum": ["b64_json", "url"]},
            "seed": {"type": "integer", "minimum": 0},
            "steps": {"type": "integer", "minimum": 1, "maximum": 150},
            "user": {"type": "string"},
        },
    )
)
IMAGE_FILE = [path_param("name")]
MODEL_QUERY = [  # instead of the body's model
    query_param("model", {"type": "string"})
    | {"description": "The model, where the body names none (llama-server's own bodies)"}
]

KEY = body(
    {},
    {
        "name": {"type": "string"},
        "scopes": {
            "type": "array",
            "minItems": 1,
            "items": {"type": "string", "enum": list(SCOPES)},
        },
        "models": {"type": "array", "items": {"type": "string"}, "nullable": True},
        "expires_in_s": {
            "type": "number",
            "minimum": 0,
            "exclusiveMinimum": True,
            "nullable": True,
        },
    },
)
MODEL_PATH = path_param("model")
TRANSFER_FILE = [MODEL_PATH, query_param("path", {"type": "string"}, True)]
KEY_ID = [path_param("key_id")]
ACTION = [  # operate.py's own list: an action added there is documented here
    {"name": "action", "in": "path", "required": True, "schema": {"enum": list(ACTIONS)}}
]
# which fields an action reads depends on the action, which OpenAPI 3.0 cannot tie to a
# path parameter: each is optional here, and the operation's summary says who needs which
OPERATOR_BODY = body(
    {},
    {
        "model": NAME,
        "bytes": {"type": "integer", "minimum": 0},
        "source_key": {"type": "string"},
    },
)


def knobs(parsers: dict[str, Parser], required: dict[str, Any] | None = None) -> dict[str, Any]:
    """A settings body: each knob as its parser takes it, and nothing else (the server
    refuses a name it does not know)."""
    shape = body(required or {}, {name: schema(parse) for name, parse in parsers.items()})
    return {**shape, "additionalProperties": False}


PAIR_BODY = knobs(PAIR_KNOBS, {"model": NAME})
KEY_BODY = knobs(KEY_KNOBS, {"key": NAME})
LIMITS_BODY = knobs(LIMIT_KNOBS)
LIMITS_BODY["properties"]["tier"] = {"type": "string", "enum": list(TIERS)}
BOX_BODY = knobs(BOX_KNOBS)
FACTS_BODY = body(
    {"origin_box": NAME, "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"}},
    {
        kind: {"type": "array", "maxItems": 1000, "items": {"type": "object"}}
        for kind in ("footprints", "refused_windows", "speeds")
    },
)

# Parameters the route table (server/routes.py) names.
MODEL_ID = [path_param("model_id")]
MODEL_NAMED = [query_param("model", NAME, True)]
MODEL_PARAM = [query_param("model", {"type": "string"})]
KEY_PARAM = [query_param("key", {"type": "string"})]
SINCE = [query_param("since", {"type": "integer"})]
LOG_READ = [
    path_param("name"),
    query_param("tail", {"type": "integer", "minimum": 1, "maximum": 100000}),
    query_param("offset", {"type": "integer", "minimum": 0}),
]
ARTIFACT = [query_param("artifact", {"type": "string"})]
POSITIVE = {"type": "integer", "minimum": 1}
PLAN = [
    query_param("model", NAME, True),
    query_param("ctx", POSITIVE),
    query_param("parallel", POSITIVE),
    query_param("kv", {"type": "string", "enum": list(KV_TYPES)}),
    query_param("max_tokens", POSITIVE),
]
# TABLE:CURSOR,… (empty items skipped); 18 digits at most keeps a cursor under 2**62
_CURSOR = rf"(({'|'.join(CURSOR_TABLES)}):[0-9]{{1,18}})"
CURSORS = rf"^{_CURSOR}?(,{_CURSOR}?)*$"
STATE = [
    query_param("since", number(-1, LARGEST)),
    query_param("wait", number(0, MAX_WAIT_S)),
    query_param("cursors", {"type": "string", "pattern": CURSORS}),
]
REPLAY = [
    query_param("table", {"type": "string", "enum": [*CURSOR_TABLES, *READING_TABLES]}, True),
    query_param("since", number(0, LARGEST)),
    query_param("limit", number(1, MAX_ROWS)),
]
YES = {"type": "string", "description": "true, 1 or yes; anything else is no"}
ROWS = [
    query_param("table", NAME, True),
    query_param("order", {"type": "string"}),
    query_param("desc", YES),
    query_param("limit", number(1, MAX_ROWS)),
    query_param("offset", number(0, LARGEST)),
]
SCOUT = [query_param("limit", number(1, MAX_ROWS)), query_param("servable", YES)]
