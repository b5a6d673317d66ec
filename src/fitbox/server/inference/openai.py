"""The OpenAI-compatible routes, as HTTP: each handler (given the engine route it reaches by
the route table, server/routes.py) parses and checks its body, then the
box opens the call (its row, its name resolved once, the checks) and serves it (placed,
sent, placed again on a counted prompt: box/serving.py), and the answer is framed here:
Starlette responses, SSE, the error envelope. The call's life (its row, its lease, its
speeds) is box/calls.py's.

The request body is forwarded as the client sent it (no re-encoding). A stream is never
buffered: each event the engine writes is yielded once it is whole (server/streams/). An
engine's own error body is put in the OpenAI error envelope, keeping what the engine said
(server/inference/engine_errors.py), so clients see one shape whoever failed.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

import fitbox
from fitbox.box.box import Box
from fitbox.box.calls import Call
from fitbox.box.resident import Resident
from fitbox.box.serving import Answer, Order, Served
from fitbox.engines.http1 import EngineResponse
from fitbox.errors import EngineFailed, FitboxError, InvalidRequest, PermissionDenied
from fitbox.server.door import timing
from fitbox.server.door.auth import is_insider
from fitbox.server.door.bodies import IMAGE_ROUTES, Kinds, check_fields, check_images, json_object
from fitbox.server.door.errors import body_for
from fitbox.server.inference import progress
from fitbox.server.inference.engine_errors import (
    client_status,
    engine_error_body,
    non_finite,
    retry_headers,
)
from fitbox.server.inference.helper import HELPER, helper_reply
from fitbox.server.manage.joining import central_key_of
from fitbox.server.streams import Reshape, Thinking, request_body, target
from fitbox.server.streams.events import done_frame
from fitbox.server.streams.reshape import Count
from fitbox.server.streams.thinking import ROUTES as THINKING_ROUTES
from fitbox.store.db import CentralKey, Store
from fitbox.store.waits import problems as store_problems

log = logging.getLogger(__name__)
__all__ = ["allowed_models", "engine_error_body", "forward", "refused", "request_id", "via_central"]
CHAT = "/v1/chat/completions"


def allowed_models(request: Request) -> tuple[str, ...] | None:
    """The models the caller's key is limited to; None when any model may be asked for."""
    key = getattr(request.state, "api_key", None)
    return key.models if key is not None else None


# A call's id when its client sent none: this process's random prefix and a counter (unique
# as uuid4 would be, without a getrandom syscall and a UUID object per call)
_ID_PREFIX = os.urandom(8).hex()
_ID_COUNTER = itertools.count(1)


def request_id(request: Request) -> str:
    return request.headers.get("x-request-id") or f"{_ID_PREFIX}{next(_ID_COUNTER):016x}"


def via_central(request: Request) -> CentralKey | None:
    """The central key a call through this box's central was made with (its word is taken
    only on a request made with the box's own key: joining.central_key_of)."""
    return central_key_of(request.headers, getattr(request.state, "api_key", None))


def _query(request: Request) -> str:
    """The client's query string without ``model`` (which named the model, not the call)."""
    if not request.scope.get("query_string"):
        return ""  # the common call: no QueryParams parsed
    return urlencode([(k, v) for k, v in request.query_params.multi_items() if k != "model"])


def refused(request: Request, path: str, body: dict[str, Any], error: FitboxError) -> None:
    """A call refused before it was placed (its body) gets its row too: outcome error, and
    the model and stream flag as far as the body said them."""
    box: Box = request.app.state.box
    model = body.get("model")
    call = box.calls.open(
        path,
        model if isinstance(model, str) else "",
        body.get("stream") is True,
        request_id(request),
        via_central(request),
    )
    setattr(request.state, timing.STAMPS_STATE, call.stamps)
    call.failed(error)


async def forward(
    request: Request,
    path: str,
    raw: bytes,
    body: dict[str, Any],
    method: str = "POST",
    images: int = 0,
) -> Response:
    """Open the call on ``body["model"]``, have the box serve it (box/serving.py), frame
    its answer: a stream, a whole reply, or a stream that waits for its model's load."""
    if body.get("model") == HELPER and path == CHAT:  # a menu, not weights: no placement
        return await helper_reply(request, path, body, request_id(request))
    box: Box = request.app.state.box
    field = thinking_for(request, path, body)
    order = Order(
        path,
        body,
        request_body(raw, field),
        request_id(request),
        allowed_models(request),
        images,
        request.headers.get("accept", "*/*"),
        method,
        _query(request),
        via_central(request),
    )
    served = box.serving.open(order)
    call = served.call
    setattr(request.state, timing.STAMPS_STATE, call.stamps)
    if served.waits:  # the 200 now, the load after it
        return _waiting(request, served, field)
    if not call.stream:
        return await _unless_abandoned(request, call, _answered_whole(served, field))
    answer = await served.serve()
    resident, response = answer.resident, answer.response
    headers = _answer_headers(served, resident)
    if response.status < 400:  # its row is stored: the status line may go
        return StreamingResponse(
            _sse(call, response, is_insider(request), served.prompt_count, call.model, field),
            status_code=response.status,
            headers={**headers, "cache-control": "no-cache", "x-accel-buffering": "no"},
            media_type=response.headers.get("content-type", "text/event-stream"),
        )
    return await _whole(call, response, headers, call.model, field)


def _answer_headers(served: Served, resident: Resident) -> dict[str, str]:
    name = resident.artifact.name
    return {**served.headers, "x-fitbox-model": name, "x-fitbox-device": resident.device}


async def _answered_whole(served: Served, field: Thinking | None) -> Response:
    answer = await served.serve()
    headers = _answer_headers(served, answer.resident)
    return await _whole(served.call, answer.response, headers, served.call.model, field)


async def _unless_abandoned(
    request: Request, call: Call, work: Coroutine[Any, Any, Response]
) -> Response:
    """A whole call runs only while its client waits for it. One whose client leaves (its
    connection closed) is cancelled: the engine's connection is closed with it, which
    llama-server takes as a stop (it cancels the task of a closed connection), its slot is
    free for the next call, and the row says abandoned."""
    answering = asyncio.ensure_future(work)
    leaving = asyncio.ensure_future(_client_left(request))
    try:
        await asyncio.wait((answering, leaving), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # fitbox is stopping: both go
        answering.cancel()
        leaving.cancel()
        await asyncio.gather(answering, leaving, return_exceptions=True)
        raise
    leaving.cancel()
    if answering.done():
        answered: Response = answering.result()
        return answered
    answering.cancel()
    await asyncio.gather(answering, return_exceptions=True)
    call.abandoned()
    return Response(status_code=499)  # nobody reads it: the connection is gone


async def _client_left(request: Request) -> None:
    """Returns once the client has closed its connection (the body is read by then: what
    the server receives next is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _waiting(request: Request, served: Served, field: Thinking | None) -> Response:
    """A stream whose model must load first: its 200 now (server/inference/progress.py)."""
    insider, call = is_insider(request), served.call

    async def relay(answer: Answer) -> AsyncGenerator[bytes, None]:
        response = answer.response
        if response.status < 400:
            async for chunk in _sse(
                call, response, insider, served.prompt_count, call.model, field
            ):
                yield chunk
            return
        content = await call.read(response)  # the engine refused it: its error, as an event
        error = engine_error_body(response.status, content, answer.resident.artifact.name)
        call.refused_by_engine(client_status(response.status, error), error["error"]["code"])
        await call.finished()
        yield b"data: " + json.dumps(error).encode() + b"\n\n" + done_frame(call.stamps)

    box: Box = request.app.state.box
    wanted = progress.wanted(request, served.order.body)
    stream = progress.waiting_stream(box, call, served.answer, relay, wanted, insider)
    return StreamingResponse(
        stream,
        headers={**served.headers, "cache-control": "no-cache", "x-accel-buffering": "no"},
        media_type="text/event-stream",
    )


async def _whole(
    call: Call,
    response: EngineResponse,
    headers: dict[str, str],
    asked: str,
    field: Thinking | None,
) -> Response:
    try:
        content = await call.read(response)
    except FitboxError as exc:
        call.failed(exc)
        await call.finished()
        raise
    if response.status >= 400:
        body = engine_error_body(response.status, content, call.resident.artifact.name)
        status = client_status(response.status, body)
        call.refused_by_engine(status, body["error"]["code"])
        await call.finished()
        headers.update(retry_headers(status))
        return JSONResponse(body, status_code=status, headers=headers)
    if non_finite(content):  # never leaves as JSON: strict parsers refuse a literal NaN
        error = EngineFailed(
            f"'{call.resident.artifact.name}' answered NaN or infinity where numbers go (its "
            "weights are likely corrupt: a bad conversion or download); fetch them again",
            code="engine_failed",
        )
        call.failed(error)
        await call.finished()
        raise error
    call.answered(response.status, content)
    content = Reshape(call.endpoint, call.resident.artifact.name, asked, field).whole(content)
    await call.finished()  # a whole reply's first byte is its last: it leaves once stored
    media_type = response.headers.get("content-type", "application/json")
    return Response(content, status_code=response.status, headers=headers, media_type=media_type)


async def _sse(
    call: Call,
    response: EngineResponse,
    insider: bool,
    count: Count,
    asked: str | None = None,
    field: Thinking | None = None,
) -> AsyncIterator[bytes]:
    """The engine's stream as it comes (the thinking moved, the asked name put back, the
    figures before its end); a failure mid-stream ends it with an SSE error event (the
    status line is long gone), recorded by the call, shaped for the caller."""
    try:
        lease = call.lease
        served, slots = call.resident.artifact.name, lease.slots if lease else 1
        reshape = Reshape(call.endpoint, served, asked or served, field, slots, count, call.stamps)
        async for chunk in reshape.stream(call.relay(response)):
            yield chunk
    except FitboxError as error:
        log.error("%s", error.message)
        await call.finished()  # the error event is the last byte: its row is stored first
        body = json.dumps(body_for(error, insider)).encode()
        yield b"data: " + body + b"\n\n" + done_frame(call.stamps)


def thinking_for(request: Request, path: str, body: dict[str, Any]) -> Thinking | None:
    """The call's thinking target; None for a route that carries no generated text (its
    key's setting is not even read)."""
    if path not in THINKING_ROUTES:
        return None
    box: Box = request.app.state.box
    key = getattr(request.state, "api_key", None)
    setting = str(box.prefs.for_key(key.key_id if key else None)["reasoning_field"])
    return target(path, body, setting)


async def health(request: Request) -> Response:
    box: Box = request.app.state.box
    gpus = [
        {"index": g.index, "name": g.name, "total_bytes": g.total, "simulated": g.simulated}
        for g in box.gpus.read()
    ]
    store: Store = request.app.state.store
    # still 200: a box whose drive is full or whose store is locked serves, unrecorded;
    # one with an unreadable models folder serves the models it can read
    problems = await store_problems(store) + box.problems() + _unreadable(box, is_insider(request))
    return JSONResponse(
        {
            "status": "degraded" if problems else "ok",
            "problems": problems,
            "service": "fitbox",
            "version": fitbox.__version__,
            "uptime_s": round(time.time() - request.app.state.started_at, 1),
            "gpus": gpus,
            **getattr(request.app.state, "identity", {}),
            "store": store.health(),
        }
    )


def _unreadable(box: Box, insider: bool) -> list[str]:
    """What the box cannot read, each with its path, owner and mode for an insider; a count
    for anyone else (a keyless /health is the network's to read)."""
    found = box.catalog.unreadable_now()
    if insider or not found:
        return found
    return [
        f"fitbox cannot read {len(found)} of its models' files or folders (which, and why, "
        "is shown to the box itself and to admin keys)"
    ]


def bound(
    handler: Callable[[Request, str], Awaitable[Response]], engine: str
) -> Callable[[Request], Awaitable[Response]]:
    """``handler`` as Starlette calls it, told the engine route its entry in the route table
    (server/routes.py) reaches."""

    async def forwarded(request: Request) -> Response:
        return await handler(request, engine)

    return forwarded


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


async def chat_completions(request: Request, engine: str) -> Response:
    return await _call(request, engine, {"model": str, "messages": list})


async def completions(request: Request, engine: str) -> Response:
    return await _call(request, engine, {"model": str, "prompt": (str, list)})


async def embeddings(request: Request, engine: str) -> Response:
    return await _call(request, engine, {"model": str, "input": (str, list)})


async def responses(request: Request, engine: str) -> Response:
    """OpenAI's Responses API (whole and streamed), served by the child itself."""
    return await _call(request, engine, {"input": (str, list)})


async def messages(request: Request, engine: str) -> Response:
    """Anthropic's Messages API shape, served by the child itself."""
    return await _call(request, engine, {"messages": list, "max_tokens": int})


async def count_tokens(request: Request, engine: str) -> Response:
    """Anthropic's token count for a Messages body (``input_tokens``), the child's own."""
    return await _call(request, engine, {"messages": list})


async def tokenize(request: Request, engine: str) -> Response:
    return await _call(request, engine, {"content": (str, list)})


async def detokenize(request: Request, engine: str) -> Response:
    return await _call(request, engine, {"tokens": list})


async def apply_template(request: Request, engine: str) -> Response:
    return await _call(request, engine, {"messages": list})


async def infill(request: Request, engine: str) -> Response:
    return await _call(request, engine, {})


async def rerank(request: Request, engine: str) -> Response:
    """``/v1/rerank`` and ``/rerank``: both reach the child's ``/v1/rerank``."""
    return await _call(request, engine, {"query": str, "documents": list})


async def props(request: Request, engine: str) -> Response:
    """The child's ``/props``; its ``model_path`` is an engine internal, for insiders only."""
    response = await _read(request, engine)
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


async def slots(request: Request, engine: str) -> Response:
    """The child's ``/slots``: every slot's prompt and generated text, other callers'
    included, so only an insider (the box itself, an admin key) may read them."""
    if not is_insider(request):
        raise PermissionDenied(
            "GET /slots shows every caller's prompt and generated text: it needs an admin key "
            "or a call from the box itself sent to an address, localhost, FITBOX_HOST or a "
            "name in FITBOX_HOST_NAMES (a web page rebound to this box sends its own name).",
            code="insider_only",
        )
    return await _read(request, engine)
