"""Forward one OpenAI call through the box, as HTTP: Starlette responses, SSE framing, the
error envelope. The call's life (its row, its lease, its speeds) is box/calls.py's.

The request body is forwarded as the client sent it (no re-encoding). A stream is never
buffered: each piece the engine writes is yielded as it arrives. An engine's own error
body is reshaped into the OpenAI error envelope, so clients see one shape whoever failed.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from fitbox.box.box import Box
from fitbox.box.calls import Call
from fitbox.box.needs import PromptSize, fits
from fitbox.box.resident import Resident
from fitbox.engines.http1 import EngineResponse
from fitbox.errors import FitboxError, PermissionDenied
from fitbox.server.errors import body_for, is_insider

log = logging.getLogger(__name__)


def engine_error_body(status: int, content: bytes, model: str) -> dict[str, Any]:
    """An engine's error, in the OpenAI envelope: its message kept, a string code added."""
    message, kind = "", ""
    try:
        parsed = json.loads(content)
        error = parsed.get("error", parsed) if isinstance(parsed, dict) else {}
        if isinstance(error, dict):
            message, kind = str(error.get("message", "")), str(error.get("type", ""))
    except (json.JSONDecodeError, UnicodeDecodeError):
        message = content[:500].decode("utf-8", errors="replace")
    if status == 501 and "embedding" in message.lower():
        message = f"'{model}' is not an embeddings model on this box (engine: {message})"
    return {
        "error": {
            "message": message or f"the engine answered HTTP {status}",
            "type": "invalid_request_error" if status < 500 or status == 501 else "server_error",
            "code": kind or f"engine_http_{status}",
            "param": None,
        }
    }


def allowed_models(request: Request) -> tuple[str, ...] | None:
    """The models the caller's key is limited to; None when any model may be asked for."""
    key = getattr(request.state, "api_key", None)
    return key.models if key is not None else None


def check_model_allowed(request: Request, box: Box, name: str) -> None:
    allowed = allowed_models(request)
    if allowed is None or name in allowed:
        return
    if box.catalog.resolve(name).name not in allowed:
        raise PermissionDenied(f"This key may not use the model '{name}'.", param="model",
                               code="model_not_allowed")  # fmt: skip


def _max_tokens(body: dict[str, Any]) -> int:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def _request_id(request: Request) -> str:
    return request.headers.get("x-request-id") or uuid.uuid4().hex


def refused(request: Request, path: str, body: dict[str, Any], error: FitboxError) -> None:
    """A call refused before it was placed (its body) gets its row too: outcome error, and
    the model and stream flag as far as the body said them."""
    box: Box = request.app.state.box
    model = body.get("model")
    call = box.calls.open(path, model if isinstance(model, str) else "",
                          body.get("stream") is True, _request_id(request))  # fmt: skip
    call.failed(error)


async def forward(request: Request, path: str, raw: bytes, body: dict[str, Any]) -> Response:
    box: Box = request.app.state.box
    call = box.calls.open(path, body["model"], bool(body.get("stream")), _request_id(request))
    try:
        check_model_allowed(request, box, body["model"])
        resident = await _placed(box, call, path, raw, body)
        response = await call.send(raw, request.headers.get("accept", "*/*"))
    except FitboxError as exc:
        call.failed(exc)
        await call.finished()  # an error is a first and last byte: it leaves once stored
        raise
    except BaseException:
        call.interrupted()
        raise
    headers = {"x-fitbox-model": resident.artifact.name, "x-fitbox-device": resident.device}
    if call.stream and response.status < 400:
        await call.written()  # the status line is the first byte: the row is stored first
        return StreamingResponse(
            _sse(call, response, is_insider(request)),
            status_code=response.status,
            headers={**headers, "cache-control": "no-cache", "x-accel-buffering": "no"},
            media_type=response.headers.get("content-type", "text/event-stream"),
        )
    return await _whole(call, response, headers)


async def _placed(box: Box, call: Call, path: str, raw: bytes, body: dict[str, Any]) -> Resident:
    """Place a call by its prompt's tokens (box/needs.py): counted by the model when it is
    ready, else bounded, counted once placed, and placed again with a larger window (or
    refused with both numbers) when the count outgrows the slot it got."""
    max_tokens, slots = _max_tokens(body), box.needs.choices(body)
    param = "messages" if "messages" in body else "prompt"
    size = await box.needs.prompt(body["model"], path, raw, body)
    size.refuse_if_too_long(param)
    need, reply = size.split(max_tokens)
    resident = await call.place(need, reply, size.tokens, slots)
    if size.exact or fits(size, resident):
        return resident
    counted = await box.needs.counted(resident, path, raw)
    if counted is None or fits(PromptSize(counted, True, size.largest), resident):
        return resident
    call.unplace()
    size = PromptSize(counted, True, size.largest)
    size.refuse_if_too_long(param)
    need, reply = size.split(max_tokens)
    return await call.place(need, reply, counted, slots)


async def _whole(call: Call, response: EngineResponse, headers: dict[str, str]) -> Response:
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
        return JSONResponse(body, status_code=response.status, headers=headers)
    call.answered(response.status, content)
    await call.finished()  # a whole reply's first byte is its last: it leaves once stored
    media_type = response.headers.get("content-type", "application/json")
    return Response(content, status_code=response.status, headers=headers, media_type=media_type)


async def _sse(call: Call, response: EngineResponse, insider: bool) -> AsyncIterator[bytes]:
    """The engine's stream as it comes; a failure mid-stream ends it with an SSE error
    event (the status line is long gone), recorded by the call, shaped for the caller."""
    try:
        async for chunk in call.relay(response):
            yield chunk
    except FitboxError as error:
        log.error("%s", error.message)
        await call.finished()  # the error event is the last byte: its row is stored first
        body = json.dumps(body_for(error, insider)).encode()
        yield b"data: " + body + b"\n\ndata: [DONE]\n\n"
