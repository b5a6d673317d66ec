"""The central's machine-readable surface: its own /openapi.json, route by route, in the
box's shape (server/views/openapi.py: the same error body, the same request bodies where a call
is forwarded to a box)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

import fitbox
from fitbox.server import routes
from fitbox.server.door.auth import Access
from fitbox.server.views.openapi import COMPONENTS, ERROR, operation, path_param, query

INFERENCE = "a central key with the inference scope, or none from the central's own host"
MANAGEMENT = "the central's own host, or a central key with the admin scope"
READ = "the central's own host, or a central key with the read or admin scope"
ROUTED = (
    "Forwarded to the box that takes the model: BOX/MODEL to that box; a bare name "
    "where it is resident (least busy), else where it fits without evicting a serving "
    "model, else where its file is; retried once on the next box before the first "
    "byte; x-fitbox-box, x-fitbox-route and a box entry in Server-Timing say which. "
)
BOX_ID = path_param("box_id")
LIMITS = {
    "type": "object",
    "properties": {name: {} for name in ("ram_max", "vram_max", "cpu_max", "storage_max")},
}
REGISTRATION = {
    "type": "object",
    "required": ["box_id", "name", "version", "url", "admin_key"],
    "properties": {
        name: {"type": "string"}
        for name in ("box_id", "name", "version", "url", "admin_key", "box_secret")
    },
}
BOX_CHANGE = {
    "type": "object",
    "properties": {"name": {"type": ["string", "null"]}, "draining": {"type": "boolean"}},
}

PATHS: dict[str, dict[str, Any]] = {
    "/health": {"get": operation("Liveness, version, how many boxes and how many are up", "open")},
    "/openapi.json": {"get": operation("This document", "open")},
    "/": {
        "get": operation(
            "The fleet page (HTML, live over SSE; whole with JavaScript off)", MANAGEMENT
        )
    },
    "/dashboard/events": {
        "get": operation(
            "The fleet page's updates: an SSE event with the re-rendered page body on each "
            "change of the fleet",
            MANAGEMENT,
            params=[query("since", "string")],
        )
    },
    "/metrics": {
        "get": operation(
            "Prometheus text: every box's state, queue, residents, memory and calls by outcome "
            "(a box label)",
            READ,
        )
    },
    "/v1/boxes": {
        "post": operation(
            "Register a box (or move one) by its persistent id; a known id needs the box_secret "
            "its first registration was given (403 box_identity_unproven), and is refused while "
            "the box on record still answers as it (409 box_id_in_use); a loopback box is "
            "refused unless the central is on loopback too",
            "a worker or admin key, or none from the central's own host",
            REGISTRATION,
        )
    },
    "/v1/fleet": {
        "get": operation(
            "Every box: state, last seen, memory per device, residents (their calls, slots "
            "and idle time counted as this is read), queue; each figure with when it was "
            "read (read_at, *_age_s)",
            MANAGEMENT,
        )
    },
    "/v1/fleet/models": {
        "get": operation(
            "Every model on any box: where resident, where on disk, where it fits now (the "
            "boxes' own plans)",
            MANAGEMENT,
        )
    },
    "/v1/fleet/boxes/{box_id}": {
        "patch": operation(
            "Name a box (null: the host name it registers) or drain it (bare-name calls go "
            "to other boxes; BOX/MODEL still reaches it)",
            MANAGEMENT,
            BOX_CHANGE,
            [BOX_ID],
        ),
        "delete": operation(
            "Forget a box: its key, its proof of identity and its cursors (its mirrored rows "
            "stay); it joins again as new",
            MANAGEMENT,
            params=[BOX_ID],
        ),
    },
    "/v1/fleet/boxes/{box_id}/limits": {
        "get": operation(
            "The box's capacity tiers, as the box says them", MANAGEMENT, params=[BOX_ID]
        ),
        "post": operation(
            "Set the central tier of the box's limits (null clears one) through the "
            "box's /v1/limits; a value above the box's own tier is refused by the box, "
            "its error passed through",
            MANAGEMENT,
            LIMITS,
            [BOX_ID],
        ),
    },
    "/v1/telemetry/tables": {"get": operation("The mirrored tables and mirror_rejects", READ)},
    "/v1/telemetry/rows": {
        "get": operation(
            "Mirrored rows of one table, each with its box_id",
            READ,
            params=[
                query("table", "string", True),
                query("box_id", "string"),
                query("desc", "boolean"),
                query("limit", "integer"),
                query("offset", "integer"),
            ],
        )
    },
    "/v1/models": {
        "get": operation("Every model of the fleet by bare name and as BOX/MODEL", INFERENCE)
    },
}
# Every inference route a box serves, the central forwards (its own /v1/models aside): read
# from the box's route table, so a route a box gains is forwarded and documented here too
FORWARDED = tuple(
    e for e in routes.ENDPOINTS if e.access is Access.INFERENCE and e.path != "/v1/models"
)


def _header(description: str, **schema: Any) -> dict[str, Any]:
    return {"description": description, "schema": {"type": "string", **schema}}


ROUTE_HEADERS = {
    "x-fitbox-box": _header("The id of the box that answered"),
    "x-fitbox-route": _header(
        "Why that box: named (BOX/MODEL), resident (a slot free there), fits (placed there "
        "without evicting a serving model), spill (placed there: its predicted wait, load "
        "included, was shorter than the wait behind the resident's full slots), on_disk",
        enum=["named", "resident", "fits", "spill", "on_disk"],
    ),
    "x-fitbox-spill": _header(
        "On a spill only, the predicted waits it compared, in seconds: "
        "'from=BOX; wait=S; to=BOX; wait=S; load=S' (the busy box's queue, and the box "
        "taken: its queue and its load, measured where a load of the model was)"
    ),
    "x-fitbox-retried-from": _header(
        "The boxes tried first, each failed before its first byte (and why)"
    ),
}
RETRY_HEADERS = {
    "Retry-After": {
        "description": "Seconds to wait before trying again",
        "schema": {"type": "integer"},
    },
    "x-should-retry": _header("true: a retry can succeed", enum=["true"]),
}


def _error(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "headers": RETRY_HEADERS,
        "content": {"application/json": {"schema": ERROR}},
    }


def _forwarded_op(op: dict[str, Any]) -> dict[str, Any]:
    ok = {
        status: {**answer, "headers": {**answer.get("headers", {}), **ROUTE_HEADERS}}
        for status, answer in op["responses"].items()
        if status != "default"
    }
    return {
        **op,
        "summary": ROUTED + op["summary"],
        "description": f"Access: {INFERENCE}. The box's errors pass through, without the "
        "box's paths and engine internals for a caller who is no insider of the central.",
        "responses": {
            **op["responses"],
            **ok,
            "502": _error(
                "No box could take the call (each tried failed before its first byte): "
                "retry after Retry-After seconds"
            ),
            "503": _error(
                "box_unavailable (with Retry-After): the boxes that have the model take no "
                "calls now (unreachable, not synced since the central started, or suspected), "
                "each named with its state; or store_unavailable: the central's store could "
                "not check the key"
            ),
        },
    }


PATHS |= {
    e.doc_path: {m: _forwarded_op(op) for m, op in routes.PATHS[e.doc_path].items()}
    for e in FORWARDED
}


def spec() -> dict[str, Any]:
    return {
        "openapi": "3.0.3",
        "info": {"title": "fitbox central", "version": fitbox.__version__},
        "paths": PATHS,
        "components": COMPONENTS,
    }


async def document(request: Request) -> Response:
    return JSONResponse(spec())
