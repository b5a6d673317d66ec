"""Forward one call to its engine child and record it. Streams pass through chunk by chunk.

The request body is forwarded as the client sent it (no re-encoding). A stream is never
buffered: each piece the engine writes is yielded as it arrives; only the last few KiB are
kept to read the usage counts for the call log. An engine's own error body is reshaped
into the OpenAI error envelope, so clients see one shape whoever failed.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from fitbox.box.box import Box
from fitbox.box.lease import Lease
from fitbox.engines.http1 import EngineConnectionError, EngineResponse
from fitbox.errors import EngineFailed, EngineTimeout, FitboxError, PermissionDenied
from fitbox.store.db import CallStart, Store

log = logging.getLogger(__name__)
_USAGE = re.compile(rb'"usage"\s*:\s*(\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\})')
_TIMINGS = re.compile(rb'"timings"\s*:\s*(\{[^{}]*\})')
_KEEP_TAIL = 16 * 1024


def _timings(tail: bytes) -> dict[str, Any]:
    """llama-server's ``timings`` of the call (the last chunk of a stream carries them)."""
    matches = _TIMINGS.findall(tail)
    try:
        timings = json.loads(matches[-1]) if matches else {}
    except json.JSONDecodeError:
        return {}
    return timings if isinstance(timings, dict) else {}


def _measured(store: Store, lease: Lease, call_id: int, tail: bytes) -> dict[str, Any]:
    """The engine's timings as call-log columns; they also become a measured speed."""
    timings = _timings(tail)
    if not timings:
        return {}
    lease.box.speeds.record(lease.resident, timings, call_id)
    return {
        "cache_tokens": timings.get("cache_n"), "prompt_ms": timings.get("prompt_ms"),
        "prompt_per_token_ms": timings.get("prompt_per_token_ms"),
        "decode_ms": timings.get("predicted_ms"),
        "decode_per_token_ms": timings.get("predicted_per_token_ms"),
    }  # fmt: skip


def _usage(tail: bytes) -> dict[str, Any]:
    matches = _USAGE.findall(tail)
    if not matches:
        return {}
    try:
        usage = json.loads(matches[-1])
    except json.JSONDecodeError:
        return {}
    return usage if isinstance(usage, dict) else {}


def _engine_failed(lease: Lease, exc: Exception) -> EngineFailed:
    child = lease.resident.child
    return EngineFailed(
        f"llama-server serving '{lease.resident.artifact.name}' failed mid-call ({exc})",
        log_tail=child.tail() if child else [],
    )


def _failed(store: Store, call_id: int, error: FitboxError) -> None:
    store.call_updated(call_id, outcome="error", http_status=error.status,
                       error_code=error.code, last_byte_at=time.time())  # fmt: skip


def _sse_error(error: FitboxError) -> bytes:
    return b"data: " + json.dumps(error.body()).encode() + b"\n\ndata: [DONE]\n\n"


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


async def forward(request: Request, path: str, raw: bytes, body: dict[str, Any]) -> Response:
    box: Box = request.app.state.box
    store: Store = request.app.state.store
    stream = bool(body.get("stream"))
    call_id = store.call_started(
        CallStart(
            request_id=(request.headers.get("x-request-id") or uuid.uuid4().hex)[:128],
            endpoint=path,
            model_asked=body["model"][:256],  # a client chooses it: keep rows bounded
            stream=stream,
            received_at=time.time(),
        )
    )
    try:
        check_model_allowed(request, box, body["model"])
        max_tokens = _max_tokens(body)
        # the prompt's tokens are not known before a tokenizer runs: ~4 bytes of request per
        # token is the estimate, used only to pick the smallest window the call may get
        lease = await box.acquire(
            body["model"], call_id=call_id, need=len(raw) // 4 + max_tokens, max_tokens=max_tokens
        )
    except FitboxError as exc:
        _failed(store, call_id, exc)
        raise
    except BaseException:
        store.call_updated(call_id, outcome="interrupted", last_byte_at=time.time())
        raise

    resident = lease.resident
    place = resident.place
    lease.expect(len(raw) // 4, max_tokens)
    store.call_updated(
        call_id, artifact=str(resident.artifact.path), admitted_at=time.time(),
        device=resident.device, window=resident.window, evicted=lease.evicted,
        load_start_at=resident.load_started_at if lease.loaded else None,
        load_ready_at=resident.ready_at if lease.loaded else None,
        rung=resident.rung.value, type_k=resident.type_k, type_v=resident.type_v,
        devices=resident.holdings(), cores=list(resident.cores),
        tensor_split=list(place.tensor_split) if place else [],
    )  # fmt: skip
    try:
        response = await lease.watched(lease.engine.request(
            "POST", path, raw, {"Content-Type": "application/json",
                                "Accept": request.headers.get("accept", "*/*")},
        ))  # fmt: skip
    except EngineConnectionError as exc:
        lease.release()
        error = _engine_failed(lease, exc)
        _failed(store, call_id, error)
        raise error from None
    except EngineTimeout as error:
        lease.release()
        _failed(store, call_id, error)
        raise
    except BaseException:
        lease.release()
        store.call_updated(call_id, outcome="interrupted", last_byte_at=time.time())
        raise

    headers = {"x-fitbox-model": resident.artifact.name, "x-fitbox-device": resident.device}
    if stream and response.status < 400:
        return StreamingResponse(
            _pass_through(response, lease, store, call_id),
            status_code=response.status,
            headers={**headers, "cache-control": "no-cache", "x-accel-buffering": "no"},
            media_type=response.headers.get("content-type", "text/event-stream"),
        )
    return await _whole(response, lease, store, call_id, headers)


async def _whole(
    response: EngineResponse, lease: Lease, store: Store, call_id: int, headers: dict[str, str]
) -> Response:
    try:
        content = await lease.watched(response.read())
    except EngineConnectionError as exc:
        error = _engine_failed(lease, exc)
        _failed(store, call_id, error)
        raise error from None
    except EngineTimeout as error:
        _failed(store, call_id, error)
        raise
    finally:
        response.close()
        lease.release()
    done = time.time()
    if response.status >= 400:
        body = engine_error_body(response.status, content, lease.resident.artifact.name)
        store.call_updated(
            call_id,
            outcome="error",
            http_status=response.status,
            error_code=body["error"]["code"],
            first_byte_at=done,
            last_byte_at=done,
        )
        return JSONResponse(body, status_code=response.status, headers=headers)
    usage = _usage(content[-_KEEP_TAIL:]) or _usage(content)
    store.call_updated(
        call_id, outcome="ok", http_status=response.status, first_byte_at=done,
        last_byte_at=done, prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=usage.get("completion_tokens"),
        **_measured(store, lease, call_id, content[-_KEEP_TAIL:]),
    )  # fmt: skip
    return Response(
        content,
        status_code=response.status,
        headers=headers,
        media_type=response.headers.get("content-type", "application/json"),
    )


async def _pass_through(
    response: EngineResponse, lease: Lease, store: Store, call_id: int
) -> AsyncIterator[bytes]:
    first_byte_at: float | None = None
    tail = b""
    outcome, error_code, status = "ok", None, response.status
    chunks = response.iter_bytes()
    try:
        while True:
            try:
                chunk = await lease.watched(anext(chunks))
            except StopAsyncIteration:
                break
            if first_byte_at is None:
                first_byte_at = time.time()
            tail = (tail + chunk)[-_KEEP_TAIL:]
            yield chunk
    except EngineConnectionError as exc:
        error = _engine_failed(lease, exc)
        outcome, error_code, status = "error", error.code, error.status
        log.error("%s", error.message)
        yield _sse_error(error)
    except EngineTimeout as timeout:
        outcome, error_code, status = "error", timeout.code, timeout.status
        log.error("%s", timeout.message)
        yield _sse_error(timeout)
    except BaseException:  # the client went away, or fitbox is stopping
        outcome = "interrupted"
        raise
    finally:
        response.close()
        lease.release()
        usage = _usage(tail)
        store.call_updated(
            call_id, outcome=outcome, http_status=status, error_code=error_code,
            first_byte_at=first_byte_at, last_byte_at=time.time(),
            prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"),
            **(_measured(store, lease, call_id, tail) if outcome == "ok" else {}),
        )  # fmt: skip
