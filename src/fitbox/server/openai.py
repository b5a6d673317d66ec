"""The OpenAI-compatible routes: parse, validate, hand to the proxy."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

import fitbox
from fitbox.box.box import Box
from fitbox.models.catalog import RESCAN_AT_MOST_EVERY_S
from fitbox.server.bodies import json_body
from fitbox.server.proxy import allowed_models, forward
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


async def chat_completions(request: Request) -> Response:
    raw, body = await json_body(request, {"model": str, "messages": list})
    return await forward(request, "/v1/chat/completions", raw, body)


async def completions(request: Request) -> Response:
    raw, body = await json_body(request, {"model": str, "prompt": (str, list)})
    return await forward(request, "/v1/completions", raw, body)


async def embeddings(request: Request) -> Response:
    raw, body = await json_body(request, {"model": str, "input": (str, list)})
    return await forward(request, "/v1/embeddings", raw, body)
