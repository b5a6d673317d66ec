"""The OpenAI-compatible routes: parse, validate, hand to the proxy."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

import fitbox
from fitbox.box.box import Box
from fitbox.errors import FitboxError
from fitbox.models.catalog import RESCAN_AT_MOST_EVERY_S
from fitbox.server.bodies import Kinds, check_fields, json_object
from fitbox.server.proxy import allowed_models, forward, refused
from fitbox.store.db import Store


async def health(request: Request) -> Response:
    box: Box = request.app.state.box
    gpus = [
        {"index": g.index, "name": g.name, "total_bytes": g.total, "simulated": g.simulated}
        for g in box.gpus.read()
    ]
    store: Store = request.app.state.store
    problems = store.problems()  # still 200: a box whose drive is full serves, unrecorded
    return JSONResponse(
        {"status": "degraded" if problems else "ok", "problems": problems,
         "service": "fitbox", "version": fitbox.__version__, "gpus": gpus,
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


async def _call(request: Request, path: str, required: Kinds) -> Response:
    """Parse and check a call's body, then forward it. A body refused here (malformed, too
    large, a field missing) still leaves a call row, with its error."""
    body: dict[str, Any] = {}
    try:
        raw, body = await json_object(request)
        check_fields(body, required)
    except FitboxError as error:
        refused(request, path, body, error)
        raise
    return await forward(request, path, raw, body)


async def chat_completions(request: Request) -> Response:
    return await _call(request, "/v1/chat/completions", {"model": str, "messages": list})


async def completions(request: Request) -> Response:
    return await _call(request, "/v1/completions", {"model": str, "prompt": (str, list)})


async def embeddings(request: Request) -> Response:
    return await _call(request, "/v1/embeddings", {"model": str, "input": (str, list)})
