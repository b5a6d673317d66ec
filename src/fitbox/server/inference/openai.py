"""The OpenAI-compatible routes: parse, validate, hand to the proxy."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

import fitbox
from fitbox.box.box import Box
from fitbox.errors import FitboxError, InvalidRequest, PermissionDenied
from fitbox.server.door.bodies import Kinds, check_fields, json_object
from fitbox.server.door.errors import is_insider
from fitbox.server.door.vision import ROUTES as IMAGE_ROUTES
from fitbox.server.door.vision import check_images
from fitbox.server.inference.proxy import forward, refused
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
        {
            "status": "degraded" if problems else "ok",
            "problems": problems,
            "service": "fitbox",
            "version": fitbox.__version__,
            "gpus": gpus,
            **getattr(request.app.state, "identity", {}),
            "store": store.health(),
        }
    )


MODEL: Kinds = {"model": str}


async def _call(request: Request, path: str, required: Kinds) -> Response:
    """Parse and check a call's body, then forward it. A body refused here (malformed, too
    large, a field missing) still leaves a call row, with its error. The model is the
    body's ``model``, else the ``model`` query parameter (routes whose engine body has
    none: ``/tokenize?model=…``)."""
    body: dict[str, Any] = {}
    images = 0  # the body's images, checked here: the box refuses them for a blind model
    try:
        raw, body = await json_object(request)
        if "model" not in body and "model" in request.query_params:
            body["model"] = request.query_params["model"]
        check_fields(body, {**MODEL, **required})
        if path in IMAGE_ROUTES:
            images = check_images(path, body, request.app.state.config.max_image)
    except FitboxError as error:
        refused(request, path, body, error)
        raise
    return await forward(request, path, raw, body, "POST", images)


async def _read(request: Request, path: str) -> Response:
    """A GET the child answers about itself, for the model in the ``model`` query parameter."""
    body: dict[str, Any] = {}
    try:
        model = request.query_params.get("model", "")
        if not model:
            raise InvalidRequest(
                f"GET {path} needs the model it is about: {path}?model=NAME", param="model"
            )
        body = {"model": model}
    except FitboxError as error:
        refused(request, path, body, error)
        raise
    return await forward(request, path, b"", body, method="GET")


async def chat_completions(request: Request) -> Response:
    return await _call(request, "/v1/chat/completions", {"model": str, "messages": list})


async def completions(request: Request) -> Response:
    return await _call(request, "/v1/completions", {"model": str, "prompt": (str, list)})


async def embeddings(request: Request) -> Response:
    return await _call(request, "/v1/embeddings", {"model": str, "input": (str, list)})


async def responses(request: Request) -> Response:
    """OpenAI's Responses API (whole and streamed), served by the child itself."""
    return await _call(request, "/v1/responses", {"input": (str, list)})


async def messages(request: Request) -> Response:
    """Anthropic's Messages API shape, served by the child itself."""
    return await _call(request, "/v1/messages", {"messages": list, "max_tokens": int})


async def tokenize(request: Request) -> Response:
    return await _call(request, "/tokenize", {"content": (str, list)})


async def detokenize(request: Request) -> Response:
    return await _call(request, "/detokenize", {"tokens": list})


async def apply_template(request: Request) -> Response:
    return await _call(request, "/apply-template", {"messages": list})


async def infill(request: Request) -> Response:
    return await _call(request, "/infill", {})


async def rerank(request: Request) -> Response:
    """``/v1/rerank`` and ``/rerank``: both reach the child's ``/v1/rerank``."""
    return await _call(request, "/v1/rerank", {"query": str, "documents": list})


async def props(request: Request) -> Response:
    """The child's ``/props``; its ``model_path`` is an engine internal, for insiders only."""
    response = await _read(request, "/props")
    if is_insider(request) or response.status_code != 200:
        return response
    try:
        found = json.loads(bytes(response.body))
    except ValueError:
        return response
    if isinstance(found, dict):
        found.pop("model_path", None)
    headers = {k: v for k, v in response.headers.items() if k.lower() != "content-length"}
    return Response(
        json.dumps(found).encode(), status_code=200, headers=headers, media_type="application/json"
    )


async def slots(request: Request) -> Response:
    """The child's ``/slots``: every slot's prompt and generated text, other callers'
    included, so only an insider (the box itself, an admin key) may read them."""
    if not is_insider(request):
        raise PermissionDenied(
            "GET /slots shows every caller's prompt and generated text: it needs an admin key "
            "or a call from the box itself sent to an address, localhost, FITBOX_HOST or a "
            "name in FITBOX_HOST_NAMES (a web page rebound to this box sends its own name).",
            code="insider_only",
        )
    return await _read(request, "/slots")
