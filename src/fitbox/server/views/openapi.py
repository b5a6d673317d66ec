"""The machine-readable surface: /openapi.json, made from the route table (server/routes.py:
each route's access class and operation, ``Op``) with the request bodies and parameters
declared in openapi_shapes.py."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

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


def operation(
    summary: str,
    access: str,
    body: dict[str, Any] | None = None,
    params: list[dict[str, Any]] | None = None,
    ok: tuple[int, ...] = (200,),
    body_optional: bool = False,
    media: str = "application/json",
) -> dict[str, Any]:
    """One operation: each status it answers with on success (``ok``), and an OpenAI error
    body for any other. ``body_optional``: no body reads as ``{}``."""
    answer = {"description": "OK", "headers": TIMING}
    operation: dict[str, Any] = {
        "summary": summary,
        "description": f"Access: {access}.",
        "responses": {
            **{str(status): answer for status in ok},
            "default": {
                "description": "An OpenAI error body",
                "headers": TIMING,
                "content": {"application/json": {"schema": ERROR}},
            },
        },
    }
    if body is not None:
        operation["requestBody"] = {
            "required": not body_optional,
            "content": {media: {"schema": body}},
        }
    if params:
        operation["parameters"] = params
    return operation


def query(name: str, kind: str, required: bool = False) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": required, "schema": {"type": kind}}


def path_param(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


@dataclass(frozen=True)
class Op:
    """One method's OpenAPI operation: what it does, its body and its parameters. Who may
    call it is its route's access class (``access``, said in words); ``who`` overrides the
    words where the route's handler narrows them (``/slots``: insiders only)."""

    summary: str
    body: dict[str, Any] | None = None
    params: list[dict[str, Any]] | None = None
    who: str | None = None
    ok: tuple[int, ...] = (200,)  # the statuses of a success (201 for a created key)
    body_optional: bool = False  # no body reads as {} (server/door/bodies.py ``empty``)
    media: str = "application/json"  # the body's media type (an upload: multipart/form-data)


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
                op.summary,
                op.who or endpoint.who,
                op.body,
                op.params,
                op.ok,
                op.body_optional,
                op.media,
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
