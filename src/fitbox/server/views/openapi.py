"""The machine-readable surface: /openapi.json, made from the route table (server/routes.py:
each route's access class and operation, ``Op``) with the request bodies and parameters
declared here."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import fitbox
from fitbox.box.preferences import BOX_KNOBS, KEY_KNOBS, LIMIT_KNOBS, PAIR_KNOBS

ERROR = {"$ref": "#/components/schemas/Error"}
TIMING = {
    "Server-Timing": {
        "description": "W3C Server Timing, ms: queue;dur, load;dur (0 when resident), ttft;dur, "
        "total;dur (a call's figures, as its call row has them); total;dur on a response that is "
        "no call. A stream's header has those known when it leaves (queue, load; none when the "
        "200 goes before a load); all four come in an SSE comment before data: [DONE].",
        "schema": {"type": "string"},
    }
}
MODEL_BODY = {"type": "object", "required": ["model"], "properties": {"model": {"type": "string"}}}


def operation(
    summary: str,
    access: str,
    body: dict[str, Any] | None = None,
    params: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "summary": summary,
        "description": f"Access: {access}.",
        "responses": {
            "200": {"description": "OK", "headers": TIMING},
            "default": {
                "description": "An OpenAI error body",
                "headers": TIMING,
                "content": {"application/json": {"schema": ERROR}},
            },
        },
    }
    if body is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": body}},
        }
    if params:
        operation["parameters"] = params
    return operation


def query(name: str, kind: str, required: bool = False) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": required, "schema": {"type": kind}}


CHAT = {
    "type": "object",
    "required": ["model", "messages"],
    "properties": {
        "model": {"type": "string"},
        "messages": {"type": "array"},
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
}
REPLY = (
    "The reply. A model's thinking is in message.reasoning_content (delta. when "
    "streamed), or reasoning, or left in content: the key's reasoning_field setting, "
    "else the box's"
)
COMPLETION = {
    "type": "object",
    "required": ["model", "prompt"],
    "properties": {
        "model": {"type": "string"},
        "prompt": {"type": "string"},
        "stream": {"type": "boolean"},
        "max_tokens": {"type": "integer"},
    },
}
EMBEDDING = {
    "type": "object",
    "required": ["model", "input"],
    "properties": {"model": {"type": "string"}, "input": {"type": "string"}},
}
RESPONSES = {
    "type": "object",
    "required": ["model", "input"],
    "properties": {
        "model": {"type": "string"},
        "input": {"type": "string"},
        "stream": {"type": "boolean"},
        "max_output_tokens": {"type": "integer"},
    },
}
MESSAGES = {
    "type": "object",
    "required": ["model", "messages", "max_tokens"],
    "properties": {
        "model": {"type": "string"},
        "messages": {"type": "array"},
        "max_tokens": {"type": "integer"},
        "stream": {"type": "boolean"},
    },
}
RERANK = {
    "type": "object",
    "required": ["model", "query", "documents"],
    "properties": {
        "model": {"type": "string"},
        "query": {"type": "string"},
        "documents": {"type": "array", "items": {"type": "string"}},
    },
}


def engine_body(*required: str) -> dict[str, Any]:
    """A body llama-server reads, plus the ``model`` fitbox places it by (or ``?model=``)."""
    return {
        "type": "object",
        "required": list(required),
        "properties": {"model": {"type": "string"}, **{r: {} for r in required}},
    }


MODEL_QUERY = [query("model", "string")]  # instead of the body's model
KEY = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "scopes": {
            "type": "array",
            "items": {"type": "string", "enum": ["admin", "inference", "read"]},
        },
        "models": {"type": "array", "items": {"type": "string"}},
        "expires_in_s": {"type": "number"},
    },
}


def path_param(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


MODEL_PATH = path_param("model")
TRANSFER_FILE = [MODEL_PATH, query("path", "string", True)]
KEY_ID = [path_param("key_id")]
ACTION = [
    {
        "name": "action",
        "in": "path",
        "required": True,
        "schema": {
            "type": "string",
            "enum": [
                "load",
                "unload",
                "pin",
                "unpin",
                "refresh-models",
                "clear-failed",
                "pull-model",
            ],
        },
    }
]


def knobs(names: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "required": list(required),
        "properties": {name: {} for name in names},
    }


PAIR_BODY = knobs({"model": None, **PAIR_KNOBS}, ("model",))
KEY_BODY = knobs({"key": None, **KEY_KNOBS}, ("key",))


@dataclass(frozen=True)
class Op:
    """One method's OpenAPI operation: what it does, its body and its parameters. Who may
    call it is its route's access class (``access``, said in words); ``who`` overrides the
    words where the route's handler narrows them (``/slots``: insiders only)."""

    summary: str
    body: dict[str, Any] | None = None
    params: list[dict[str, Any]] | None = None
    who: str | None = None


class Documented(Protocol):
    """What the document needs of a route (server/routes.py ``Endpoint``)."""

    @property
    def doc_path(self) -> str: ...
    @property
    def who(self) -> str: ...
    @property
    def ops(self) -> Mapping[str, Op]: ...


def paths(endpoints: Iterable[Documented]) -> dict[str, dict[str, Any]]:
    """Each route's operations, by OpenAPI path and method."""
    found: dict[str, dict[str, Any]] = {}
    for endpoint in endpoints:
        for method, op in endpoint.ops.items():
            found.setdefault(endpoint.doc_path, {})[method] = operation(
                op.summary, op.who or endpoint.who, op.body, op.params
            )
    return found


def spec(endpoints: Iterable[Documented]) -> dict[str, Any]:
    return {
        "openapi": "3.0.3",
        "info": {"title": "fitbox", "version": fitbox.__version__},
        "paths": paths(endpoints),
        "components": COMPONENTS,
    }


COMPONENTS: dict[str, Any] = {
    "schemas": {
        "Error": {
            "type": "object",
            "required": ["error"],
            "properties": {
                "error": {
                    "type": "object",
                    "required": ["message", "type", "code", "param"],
                    "properties": {
                        "message": {"type": "string"},
                        "type": {"type": "string"},
                        "code": {"type": "string"},
                        "param": {"type": "string", "nullable": True},
                    },
                }
            },
        }
    },
    "securitySchemes": {
        "bearer": {"type": "http", "scheme": "bearer"},
        "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
    },
}


# Parameters and bodies the route table (server/routes.py) names.
MODEL_ID = [path_param("model_id")]
MODEL_NAMED = [query("model", "string", True)]
MODEL_PARAM = [query("model", "string")]
KEY_PARAM = [query("key", "string")]
SINCE = [query("since", "integer")]
ARTIFACT = [query("artifact", "string")]
PLAN = [
    query("model", "string", True),
    query("ctx", "integer"),
    query("parallel", "integer"),
    query("kv", "string"),
    query("max_tokens", "integer"),
]
STATE = [query("since", "integer"), query("wait", "number"), query("cursors", "string")]
REPLAY = [query("table", "string", True), query("since", "integer"), query("limit", "integer")]
ROWS = [
    query("table", "string", True),
    query("order", "string"),
    query("desc", "boolean"),
    query("limit", "integer"),
    query("offset", "integer"),
]
SCOUT = [query("limit", "integer"), query("servable", "boolean")]
LIMITS_BODY = knobs({"tier": None, **LIMIT_KNOBS})
BOX_BODY = knobs(BOX_KNOBS)
FACTS_BODY = {
    "type": "object",
    "required": ["origin_box", "sha256"],
    "properties": {
        "origin_box": {"type": "string"},
        "sha256": {"type": "string"},
        "footprints": {"type": "array", "items": {"type": "object"}},
        "refused_windows": {"type": "array", "items": {"type": "object"}},
        "speeds": {"type": "array", "items": {"type": "object"}},
    },
}
