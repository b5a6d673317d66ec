"""Forward one call through the box, as HTTP: Starlette responses, SSE framing, the error
envelope. The call's life (its row, its lease, its speeds) is box/calls.py's.

The request body is forwarded as the client sent it (no re-encoding). A stream is never
buffered: each event the engine writes is yielded once it is whole (server/streams/reshape.py). An
engine's own error body is put in the OpenAI error envelope, keeping what the engine said
(server/inference/engine_errors.py), so clients see one shape whoever failed.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from fitbox.box.box import Box
from fitbox.box.calls import Call
from fitbox.box.needs import PromptSize, fits
from fitbox.box.resident import Resident
from fitbox.engines.http1 import EngineResponse
from fitbox.errors import (
    FitboxError,
    InvalidRequest,
    ModelNotFound,
    PermissionDenied,
    RouteNotServed,
)
from fitbox.server.door import timing
from fitbox.server.door.errors import body_for, is_insider
from fitbox.server.door.vision import check_vision
from fitbox.server.inference import progress
from fitbox.server.inference.engine_errors import engine_error_body, retry_headers
from fitbox.server.inference.thinking import thinking_for
from fitbox.server.streams import Reshape, Thinking, request_body
from fitbox.server.streams.reshape import Count
from fitbox.server.streams.server_timing import done_frame

log = logging.getLogger(__name__)
__all__ = ["allowed_models", "check_model_allowed", "engine_error_body", "forward", "refused"]


def allowed_models(request: Request) -> tuple[str, ...] | None:
    """The models the caller's key is limited to; None when any model may be asked for."""
    key = getattr(request.state, "api_key", None)
    return key.models if key is not None else None


def check_model_allowed(request: Request, box: Box, name: str) -> None:
    allowed = allowed_models(request)
    if allowed is None or name in allowed:
        return
    if box.catalog.resolve(name).name not in allowed:
        raise PermissionDenied(
            f"This key may not use the model '{name}'.", param="model", code="model_not_allowed"
        )


def routed_name(box: Box, asked: str) -> tuple[str, dict[str, str]]:
    """The name a call is placed under: the one asked, or the box's default model when the
    box has no model of that name (``FITBOX_DEFAULT_MODEL``), said in a header."""
    default = box.config.default_model
    if not default or default == asked:
        return asked, {}
    try:
        box.asks.named(asked)
    except ModelNotFound as missing:
        try:
            box.asks.named(default)
        except ModelNotFound:
            raise ModelNotFound(
                f"{missing.message} Its stand-in, FITBOX_DEFAULT_MODEL '{default}', is not on "
                "this box either.",
                param="model",
            ) from None
        return default, {"x-fitbox-default-model": default}
    return asked, {}


def check_served(box: Box, name: str, path: str, body: dict[str, Any] | None = None) -> None:
    """Refuse, before anything is loaded, a route no variant of ``name`` can serve: its
    engine kind has no such route, ``/v1/rerank`` on a model that is not a reranker, or
    image parts for a model that reads none."""
    artifacts = box.asks.named(name).artifacts
    kinds = [box.engines.for_artifact(a) for a in artifacts]
    if not any(path in kind.routes() for kind in kinds):
        served_by = ", ".join(sorted({kind.name for kind in kinds}))
        raise RouteNotServed(
            f"'{name}' runs on {served_by}, which does not serve {path}.", param="model"
        )
    if path == "/v1/rerank" and not any(a.facts.is_reranker for a in artifacts):
        raise InvalidRequest(
            f"'{name}' is not a reranker (its GGUF's pooling type is not rank), so it cannot "
            "serve /v1/rerank; name a reranker model (GET /v1/models lists them).",
            param="model",
            code="not_a_reranker",
        )
    if body is not None:
        check_vision(name, artifacts, path, body)


def _max_tokens(body: dict[str, Any]) -> int:
    for key in ("max_completion_tokens", "max_tokens", "max_output_tokens", "n_predict"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


# A call's id when its client sent none: this process's random prefix and a counter (unique
# as uuid4 would be, without a getrandom syscall and a UUID object per call)
_ID_PREFIX = os.urandom(8).hex()
_ID_COUNTER = itertools.count(1)


def _request_id(request: Request) -> str:
    return request.headers.get("x-request-id") or f"{_ID_PREFIX}{next(_ID_COUNTER):016x}"


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
        _request_id(request),
    )
    setattr(request.state, timing.STAMPS_STATE, call.stamps)
    call.failed(error)


async def forward(
    request: Request, path: str, raw: bytes, body: dict[str, Any], method: str = "POST"
) -> Response:
    """Place the call on ``body["model"]`` and send it to the child's ``path``."""
    box: Box = request.app.state.box
    asked: str = body["model"]
    call = box.calls.open(path, asked, bool(body.get("stream")), _request_id(request))
    setattr(request.state, timing.STAMPS_STATE, call.stamps)
    accept = request.headers.get("accept", "*/*")
    field = thinking_for(request, path, body)
    raw = request_body(raw, field)
    try:
        check_model_allowed(request, box, asked)
        name, headers = routed_name(box, asked)
        if name != asked:
            check_model_allowed(request, box, name)  # a key's limit holds for what serves
        check_served(box, name, path, body)
        slots = box.needs.choices(body)  # an n the box cannot give: refused before any 200
        query = _query(request)
        count = _prompt_count(box, call, path, raw)
        if call.stream and progress.must_load(box, name):  # the 200 now, the load after it

            async def start() -> EngineResponse:
                sending = _Sending(raw, accept, method, query)
                return (await _sent(box, call, path, body, name, slots, sending))[1]

            return _waiting(request, call, start, body, headers, asked, field, count)
        sending = _Sending(raw, accept, method, query)
        resident, response = await _sent(box, call, path, body, name, slots, sending)
    except FitboxError as exc:
        call.failed(exc)
        await call.finished()  # an error is a first and last byte: it leaves once stored
        raise
    except BaseException:
        call.interrupted()
        raise
    served = resident.artifact.name
    headers.update({"x-fitbox-model": served, "x-fitbox-device": resident.device})
    if call.stream and response.status < 400:
        await call.written()  # the status line is the first byte: the row is stored first
        return StreamingResponse(
            _sse(call, response, is_insider(request), count, asked, field),
            status_code=response.status,
            headers={**headers, "cache-control": "no-cache", "x-accel-buffering": "no"},
            media_type=response.headers.get("content-type", "text/event-stream"),
        )
    return await _whole(call, response, headers, asked, field)


def _waiting(
    request: Request,
    call: Call,
    start: progress.Start,
    body: dict[str, Any],
    headers: dict[str, str],
    asked: str,
    field: Thinking | None,
    count: Count,
) -> Response:
    """A stream whose model must load first: its 200 now (server/inference/progress.py)."""
    insider = is_insider(request)

    async def relay(response: EngineResponse) -> AsyncGenerator[bytes, None]:
        if response.status < 400:
            async for chunk in _sse(call, response, insider, count, asked, field):
                yield chunk
            return
        content = await call.read(response)  # the engine refused it: its error, as an event
        error = engine_error_body(response.status, content, call.resident.artifact.name)
        call.refused_by_engine(response.status, error["error"]["code"])
        await call.finished()
        yield b"data: " + json.dumps(error).encode() + b"\n\n" + done_frame(call.stamps)

    box: Box = request.app.state.box
    stream = progress.waiting_stream(
        box, call, start, relay, progress.wanted(request, body), insider
    )
    return StreamingResponse(
        stream,
        headers={**headers, "cache-control": "no-cache", "x-accel-buffering": "no"},
        media_type="text/event-stream",
    )


@dataclass(frozen=True)
class _Sending:
    """What goes to the engine once the call is placed: the body and the request line's
    parts, as the client sent them."""

    raw: bytes
    accept: str
    method: str
    query: str


async def _sent(
    box: Box, call: Call, path: str, body: dict[str, Any], name: str, slots: int, sending: _Sending
) -> tuple[Resident, EngineResponse]:
    """Place the call and send it. A call sent on its prompt's bound that the engine
    refuses because the slot it got cannot hold the prompt is placed again by the count
    the refusal carries (a larger window, or refused with both numbers), and sent once
    more: the common long prompt costs no counting round trips before it is sent."""
    resident, size = await _placed(box, call, path, sending.raw, body, name, slots)
    response = await _send(call, sending)
    if call.prompt_tokens is not None:  # counted before it went: the engine's answer stands
        return resident, response
    counted = await call.refused_prompt(response)
    if counted is None:
        return resident, response
    response.close()
    call.unplace()
    log.info(
        "%s: its engine counted the prompt at %d tokens, more than the %d-token slot "
        "it was sent to; placed again by that count",
        call.model,
        counted,
        resident.slots.window_each(resident.window),
    )
    resident = await _placed_by_count(call, body, name, slots, counted, size.largest)
    return resident, await _send(call, sending)


async def _send(call: Call, sending: _Sending) -> EngineResponse:
    return await call.send(sending.raw, sending.accept, sending.method, sending.query)


async def _placed(
    box: Box, call: Call, path: str, raw: bytes, body: dict[str, Any], name: str, slots: int
) -> tuple[Resident, PromptSize]:
    """Place a call by its prompt's tokens (box/needs.py): counted by the model when it is
    ready and its engine cannot say a prompt is too long, else bounded. A bound that
    overflows the slot it got is counted once placed, and placed again with a larger
    window (or refused with both numbers) when the count outgrows it; unless its engine
    says so itself when it is sent (``_sent``). Returns the size it was first placed by."""
    size = await box.needs.prompt(name, path, raw, body)
    size.refuse_if_too_long(_prompt_param(body))
    need, reply = size.split(_max_tokens(body))
    resident = await call.place(need, reply, size.tokens, slots, name, size.exact)
    if size.exact or fits(size, resident) or resident.engine.sends_on_bound(path):
        return resident, size
    counted = await box.needs.counted(resident, path, raw)
    if counted is None or fits(PromptSize(counted, True, size.largest), resident):
        return resident, size
    call.unplace()
    return await _placed_by_count(call, body, name, slots, counted, size.largest), size


async def _placed_by_count(
    call: Call, body: dict[str, Any], name: str, slots: int, counted: int, largest: int
) -> Resident:
    """Place again a call whose prompt its engine counted at ``counted`` tokens, more
    than the slot it had: a window that holds it, or refused with both numbers."""
    size = PromptSize(counted, True, largest)
    size.refuse_if_too_long(_prompt_param(body))
    need, reply = size.split(_max_tokens(body))
    return await call.place(need, reply, counted, slots, name, counted=True)


def _prompt_param(body: dict[str, Any]) -> str:
    """The field a too-long prompt came in: chat's and Anthropic's ``messages``, the
    Responses API's and embeddings' ``input``, a completion's ``prompt``."""
    return next((field for field in ("messages", "input") if field in body), "prompt")


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
        call.refused_by_engine(response.status, body["error"]["code"])
        await call.finished()
        headers.update(retry_headers(response.status))
        return JSONResponse(body, status_code=response.status, headers=headers)
    call.answered(response.status, content)
    content = Reshape(call.endpoint, call.resident.artifact.name, asked, field).whole(content)
    await call.finished()  # a whole reply's first byte is its last: it leaves once stored
    media_type = response.headers.get("content-type", "application/json")
    return Response(content, status_code=response.status, headers=headers, media_type=media_type)


def _prompt_count(box: Box, call: Call, path: str, raw: bytes) -> Count:
    """The call's prompt tokens: as counted before placing, else by its engine now."""

    async def count() -> int | None:
        if call.prompt_tokens is not None:
            return call.prompt_tokens
        return await box.needs.counted(call.resident, path, raw)

    return count


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
