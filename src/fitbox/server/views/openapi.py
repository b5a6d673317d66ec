"""The machine-readable surface: /openapi.json, written out route by route."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

import fitbox

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


def _op(
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


def _query(name: str, kind: str, required: bool = False) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": required, "schema": {"type": kind}}


INFERENCE = "a key with the inference scope, or none from the box itself or a trusted network"
MANAGEMENT = "the box itself, or a key with the admin scope"
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


def _engine_body(*required: str) -> dict[str, Any]:
    """A body llama-server reads, plus the ``model`` fitbox places it by (or ``?model=``)."""
    return {
        "type": "object",
        "required": list(required),
        "properties": {"model": {"type": "string"}, **{r: {} for r in required}},
    }


MODEL_QUERY = [_query("model", "string")]  # instead of the body's model
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
MODEL_PATH = {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}
TRANSFER_FILE = [MODEL_PATH, _query("path", "string", True)]
KEY_ID = [{"name": "key_id", "in": "path", "required": True, "schema": {"type": "string"}}]
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


def _knobs(names: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "required": list(required),
        "properties": {name: {} for name in names},
    }


from fitbox.box.preferences import BOX_KNOBS, KEY_KNOBS, LIMIT_KNOBS, PAIR_KNOBS  # noqa: E402

PAIR_BODY = _knobs({"model": None, **PAIR_KNOBS}, ("model",))
KEY_BODY = _knobs({"key": None, **KEY_KNOBS}, ("key",))

PATHS: dict[str, dict[str, Any]] = {
    "/health": {
        "get": _op(
            "Liveness (200; status ok or degraded, with the problems to fix), "
            "version, GPUs (simulated ones labelled), store",
            "open",
        )
    },
    "/v1/models": {"get": _op("The catalog, with residency", INFERENCE)},
    "/v1/chat/completions": {
        "post": _op("Chat (SSE with stream: true). " + REPLY, INFERENCE, CHAT)
    },
    "/v1/completions": {
        "post": _op(
            "Text completion. A model's thinking is in the choice's "
            "reasoning_content (or reasoning) beside text",
            INFERENCE,
            COMPLETION,
        )
    },
    "/v1/embeddings": {
        "post": _op(
            "Embeddings (embedding models; a decoder with the embeddings setting)",
            INFERENCE,
            EMBEDDING,
        )
    },
    "/v1/models/{model_id}": {
        "get": _op(
            "One model by name, alias or family name (OpenAI's retrieve), with meta",
            INFERENCE,
            params=[
                {"name": "model_id", "in": "path", "required": True, "schema": {"type": "string"}}
            ],
        )
    },
    "/v1/responses": {
        "post": _op(
            "OpenAI Responses API (SSE with stream: true); a model's "
            "thinking is a reasoning output item",
            INFERENCE,
            RESPONSES,
            MODEL_QUERY,
        )
    },
    "/v1/messages": {
        "post": _op(
            "Anthropic Messages API shape (SSE with stream: true); a "
            "model's thinking is a thinking block",
            INFERENCE,
            MESSAGES,
            MODEL_QUERY,
        )
    },
    "/v1/rerank": {
        "post": _op("Rerank documents (reranker models)", INFERENCE, RERANK, MODEL_QUERY)
    },
    "/rerank": {
        "post": _op("Rerank documents: /v1/rerank's alias", INFERENCE, RERANK, MODEL_QUERY)
    },
    "/tokenize": {
        "post": _op(
            "The model's tokens for content", INFERENCE, _engine_body("content"), MODEL_QUERY
        )
    },
    "/detokenize": {"post": _op("Text for tokens", INFERENCE, _engine_body("tokens"), MODEL_QUERY)},
    "/apply-template": {
        "post": _op(
            "The prompt the model's chat template makes of messages",
            INFERENCE,
            _engine_body("messages"),
            MODEL_QUERY,
        )
    },
    "/infill": {
        "post": _op(
            "Fill in the middle (models with FIM tokens)", INFERENCE, _engine_body(), MODEL_QUERY
        )
    },
    "/props": {
        "get": _op(
            "The loaded child's properties (model_path for insiders only)",
            INFERENCE,
            params=[_query("model", "string", True)],
        )
    },
    "/slots": {
        "get": _op(
            "The loaded child's slots (every caller's prompt: insiders only)",
            "the box itself, or a key with the admin scope",
            params=[_query("model", "string", True)],
        )
    },
    "/v1/plan": {
        "get": _op(
            "What the box would load for a model, and where",
            MANAGEMENT,
            params=[
                _query("model", "string", True),
                _query("ctx", "integer"),
                _query("parallel", "integer"),
                _query("kv", "string"),
                _query("max_tokens", "integer"),
            ],
        )
    },
    "/v1/telemetry/state": {
        "get": _op(
            "The change counter; long-polls until it passes `since` or `wait` seconds pass, or "
            "the box stops (stopping: true). `cursors=TABLE:CURSOR,…`: the answer carries each "
            "changed table's first page from its cursor (pages)",
            "the box itself, or a key with the read or admin scope",
            params=[
                _query("since", "integer"),
                _query("wait", "number"),
                _query("cursors", "string"),
            ],
        )
    },
    "/v1/telemetry": {
        "get": _op(
            "Cursor replay of a table by seq",
            "the box itself, or a key with the read scope",
            params=[
                _query("table", "string", True),
                _query("since", "integer"),
                _query("limit", "integer"),
            ],
        )
    },
    "/v1/telemetry/tables": {
        "get": _op(
            "Every table and view with the columns a reader may see (secrets withheld)",
            "the box itself, or a key with the read scope",
        )
    },
    "/v1/telemetry/rows": {
        "get": _op(
            "Rows of any table or view, read-only, ordered by one of its columns",
            "the box itself, or a key with the read scope",
            params=[
                _query("table", "string", True),
                _query("order", "string"),
                _query("desc", "boolean"),
                _query("limit", "integer"),
                _query("offset", "integer"),
            ],
        )
    },
    "/v1/telemetry/scout": {
        "get": _op(
            "The newest findings of `fitbox scout`: path, what led to it, live or historical, "
            "servable once its header was read",
            "the box itself, or a key with the read scope",
            params=[_query("limit", "integer"), _query("servable", "boolean")],
        )
    },
    "/calls": {"get": _op("An HTML page of the latest calls", "the box itself only")},
    "/metrics": {
        "get": _op(
            "Prometheus text: calls, errors, tokens and times per model, "
            "devices, loads, evictions, refusals, estimate errors, and each "
            "child's llamacpp:* with a model label",
            "the box itself, or a key with the read scope",
        )
    },
    "/": {"get": _op("The live dashboard (HTML; whole with JavaScript off)", MANAGEMENT)},
    "/dashboard/events": {
        "get": _op(
            "The dashboard's updates: an SSE event with the "
            "re-rendered page body on each change, nothing between",
            MANAGEMENT,
            params=[_query("since", "integer")],
        )
    },
    "/mcp": {
        "post": _op(
            "MCP over Streamable HTTP (JSON-RPC; needs 'fitbox[mcp]'): tools "
            "list_models, residents, queue, plan, load, unload, recent_calls, "
            "box_limits, each needing what the route it mirrors needs",
            "a key, or none from the box itself or a trusted network",
        )
    },
    "/v1/residents": {"get": _op("Loaded models: device, bytes, state, calls", MANAGEMENT)},
    "/v1/storage": {"get": _op("Drives holding models", MANAGEMENT)},
    "/v1/queue": {"get": _op("Calls waiting for room, and what blocks them", MANAGEMENT)},
    "/v1/operator/{action}": {
        "post": _op("Operator action, recorded", MANAGEMENT, MODEL_BODY, ACTION)
    },
    "/v1/cores": {
        "get": _op("Physical cores: kept for the OS, claimed by which engine, free", MANAGEMENT)
    },
    "/v1/limits": {
        "get": _op("Capacity tiers: device, box, central, effective", MANAGEMENT),
        "post": _op(
            "Set box limits, or with tier: central the central tier (a "
            "central's allotment); a value above its parent tier is refused",
            MANAGEMENT,
            _knobs({"tier": None, **LIMIT_KNOBS}),
        ),
    },
    "/v1/settings/box": {
        "get": _op("Box-wide knobs: own, default, effective", MANAGEMENT),
        "post": _op("Set box-wide knobs (null clears one)", MANAGEMENT, _knobs(BOX_KNOBS)),
    },
    "/v1/settings/pair": {
        "get": _op(
            "Per-model knobs: own, box-wide, effective",
            MANAGEMENT,
            params=[_query("model", "string")],
        ),
        "post": _op("Set a model's knobs (null clears one)", MANAGEMENT, PAIR_BODY),
    },
    "/v1/settings/key": {
        "get": _op(
            "Per-key knobs (reasoning_field, progress): own, effective",
            MANAGEMENT,
            params=[_query("key", "string")],
        ),
        "post": _op("Set a key's knobs (null clears one)", MANAGEMENT, KEY_BODY),
    },
    "/v1/verdicts": {
        "get": _op(
            "Every variant x rung x K/V type priced now, and the Auto pick",
            MANAGEMENT,
            params=[_query("model", "string")],
        )
    },
    "/v1/transfer/{model}/manifest": {
        "get": _op(
            "A model's files for another box: path, bytes, sha256", MANAGEMENT, params=[MODEL_PATH]
        )
    },
    "/v1/transfer/{model}/chunksums": {
        "get": _op(
            "The sha256 of each fixed chunk of one of the model's files",
            MANAGEMENT,
            params=TRANSFER_FILE,
        )
    },
    "/v1/transfer/{model}/file": {
        "get": _op(
            "One of the model's files, streamed; Range: bytes=… answered 206; 429 with "
            "Retry-After beyond the transfer cap",
            MANAGEMENT,
            params=TRANSFER_FILE,
        )
    },
    "/v1/hashes": {
        "get": _op(
            "Every weight file's kept sha256 (hashed once); ?artifact=PATH "
            "hashes that model file of the catalog once and lists it alone",
            MANAGEMENT,
            params=[_query("artifact", "string")],
        )
    },
    "/v1/facts/import": {
        "post": _op(
            "Footprints, refused windows and speeds another box measured for a file with this "
            "sha256 (one list at least), filed under this box's file with their origin; plans "
            "price from them (basis imported, refused_windows, speeds_measured_by) until this "
            "box measures its own",
            MANAGEMENT,
            {
                "type": "object",
                "required": ["origin_box", "sha256"],
                "properties": {
                    "origin_box": {"type": "string"},
                    "sha256": {"type": "string"},
                    "footprints": {"type": "array", "items": {"type": "object"}},
                    "refused_windows": {"type": "array", "items": {"type": "object"}},
                    "speeds": {"type": "array", "items": {"type": "object"}},
                },
            },
        )
    },
    "/v1/keys": {
        "get": _op("API keys, without secrets", MANAGEMENT),
        "post": _op("Create a key (the secret is shown once)", MANAGEMENT, KEY),
    },
    "/v1/keys/{key_id}": {
        "get": _op("One key", MANAGEMENT, params=KEY_ID),
        "delete": _op("Revoke a key", MANAGEMENT, params=KEY_ID),
    },
}


# Not plain JSON-over-HTTP, so not fuzzed as such (tests/test_fuzz_surface.py): MCP answers
# in JSON-RPC's own error shape past the door; the events stream does not end.
OTHER_PROTOCOLS = frozenset({"/mcp", "/dashboard/events"})


def spec() -> dict[str, Any]:
    return {
        "openapi": "3.0.3",
        "info": {"title": "fitbox", "version": fitbox.__version__},
        "paths": PATHS,
        "components": {
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
        },
    }


async def document(request: Request) -> Response:
    return JSONResponse(spec())
