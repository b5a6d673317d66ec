"""The OpenAI-compatible routes: parse, validate, hand to the proxy."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

import fitbox
from fitbox.box.box import Box
from fitbox.errors import InvalidRequest
from fitbox.models.catalog import RESCAN_AT_MOST_EVERY_S
from fitbox.server.proxy import allowed_models, forward
from fitbox.store.db import Store


async def health(request: Request) -> Response:
    box: Box = request.app.state.box
    gpus = [
        {"index": g.index, "name": g.name, "total_bytes": g.total, "simulated": g.simulated}
        for g in box.gpus.read()
    ]
    store: Store = request.app.state.store
    return JSONResponse(
        {"status": "ok", "service": "fitbox", "version": fitbox.__version__, "gpus": gpus,
         "store": store.health()}
    )  # fmt: skip


async def list_models(request: Request) -> Response:
    box: Box = request.app.state.box
    box.catalog.refresh(max_age=RESCAN_AT_MOST_EVERY_S)
    resident = {r.key: r for r in box.residents()}
    allowed = allowed_models(request)
    data = []
    for artifact in box.catalog.artifacts():
        if allowed is not None and artifact.name not in allowed:
            continue
        r = resident.get(artifact.key)
        data.append(
            {
                "id": artifact.name,
                "object": "model",
                "created": int(artifact.path.stat().st_mtime),
                "owned_by": "fitbox",
                "aliases": box.catalog.aliases_of(artifact.name),
                "resident": r is not None,
                "state": r.state.value
                if r
                else ("failed" if box.crashes.failed(artifact.key) else "unloaded"),
                "device": r.device if r else None,
                "simulated": r.simulated if r else False,
                "footprint_bytes": r.footprint.total if r else None,
                "size_bytes": artifact.facts.shape.weights_bytes,
                "architecture": artifact.facts.architecture,
            }
        )
    return JSONResponse({"object": "list", "data": data})


async def parse_body(
    request: Request, required: dict[str, type | tuple[type, ...]]
) -> tuple[bytes, dict[str, Any]]:
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"The request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    for field, kind in required.items():
        if field not in body:
            raise InvalidRequest(f"Missing required field '{field}'.", param=field)
        if not isinstance(body[field], kind) or (
            isinstance(kind, type) and kind is str and not body[field]
        ):
            raise InvalidRequest(f"Field '{field}' has the wrong type or is empty.", param=field)
    return raw, body


async def chat_completions(request: Request) -> Response:
    raw, body = await parse_body(request, {"model": str, "messages": list})
    return await forward(request, "/v1/chat/completions", raw, body)


async def completions(request: Request) -> Response:
    raw, body = await parse_body(request, {"model": str, "prompt": (str, list)})
    return await forward(request, "/v1/completions", raw, body)


async def embeddings(request: Request) -> Response:
    raw, body = await parse_body(request, {"model": str, "input": (str, list)})
    return await forward(request, "/v1/embeddings", raw, body)
