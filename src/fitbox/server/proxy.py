"""Forward one call to its engine child and record it. Streams pass through chunk by chunk.

The request body is forwarded as the client sent it (no re-encoding). A stream is never
buffered: each chunk the engine writes is yielded as it arrives; only the last few KiB are
kept to read the usage counts for the call log.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from fitbox.box.box import Box, Lease
from fitbox.errors import EngineFailed, FitboxError
from fitbox.store.db import CallStart, Store

log = logging.getLogger(__name__)
_USAGE = re.compile(rb'"usage"\s*:\s*(\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\})')
_KEEP_TAIL = 16 * 1024


def _usage(tail: bytes) -> dict[str, Any]:
    matches = _USAGE.findall(tail)
    if not matches:
        return {}
    try:
        usage = json.loads(matches[-1])
    except json.JSONDecodeError:
        return {}
    return usage if isinstance(usage, dict) else {}


def _record(store: Store, call_id: int, **values: Any) -> None:
    """Queue the update; the client never waits for the store."""
    store.call_updated(call_id, **values)


def _engine_failed(lease: Lease, exc: Exception) -> EngineFailed:
    child = lease.resident.child
    tail = child.tail() if child else []
    return EngineFailed(
        f"llama-server serving '{lease.resident.artifact.name}' failed mid-call "
        f"({type(exc).__name__}: {exc})",
        log_tail=tail,
    )


async def _send(http: httpx.AsyncClient, upstream: httpx.Request) -> httpx.Response:
    """Send once more if a pooled connection was closed before any response came back:
    llama-server (cpp-httplib) drops idle keep-alive connections on its own schedule."""
    try:
        return await http.send(upstream, stream=True)
    except (httpx.RemoteProtocolError, httpx.ConnectError, httpx.ReadError):
        return await http.send(upstream, stream=True)


def _sse_error(error: FitboxError) -> bytes:
    return b"data: " + json.dumps(error.body()).encode() + b"\n\ndata: [DONE]\n\n"


async def forward(request: Request, path: str, raw: bytes, body: dict[str, Any]) -> Response:
    box: Box = request.app.state.box
    store: Store = request.app.state.store
    stream = bool(body.get("stream"))
    call_id = store.call_started(
        CallStart(
            request_id=request.headers.get("x-request-id") or uuid.uuid4().hex,
            endpoint=path,
            model_asked=body["model"],
            stream=stream,
            received_at=time.time(),
        )
    )
    try:
        lease = await box.acquire(body["model"])
    except FitboxError as exc:
        _record(
            store,
            call_id,
            outcome="error",
            http_status=exc.status,
            error_code=exc.code,
            last_byte_at=time.time(),
        )
        raise
    except BaseException:
        _record(store, call_id, outcome="interrupted", last_byte_at=time.time())
        raise

    resident = lease.resident
    _record(
        store,
        call_id,
        artifact=str(resident.artifact.path),
        admitted_at=time.time(),
        device=resident.device,
        window=resident.window,
        evicted=lease.evicted,
        load_start_at=resident.load_started_at if lease.loaded else None,
        load_ready_at=resident.ready_at if lease.loaded else None,
    )
    upstream = box.http.build_request(
        "POST",
        lease.base_url + path,
        content=raw,
        headers={
            "content-type": "application/json",
            "accept": request.headers.get("accept", "*/*"),
        },
    )
    try:
        response = await _send(box.http, upstream)
    except httpx.HTTPError as exc:
        lease.release()
        error = _engine_failed(lease, exc)
        _record(
            store,
            call_id,
            outcome="error",
            http_status=error.status,
            error_code=error.code,
            last_byte_at=time.time(),
        )
        raise error from None
    except BaseException:
        lease.release()
        _record(store, call_id, outcome="interrupted", last_byte_at=time.time())
        raise

    headers = {"x-fitbox-model": resident.artifact.name, "x-fitbox-device": resident.device}
    if not stream:
        try:
            content = await response.aread()
        except httpx.HTTPError as exc:
            error = _engine_failed(lease, exc)
            _record(
                store,
                call_id,
                outcome="error",
                http_status=error.status,
                error_code=error.code,
                last_byte_at=time.time(),
            )
            raise error from None
        finally:
            await response.aclose()
            lease.release()
        done = time.time()
        usage = _usage(content[-_KEEP_TAIL:]) or _usage(content)
        _record(
            store,
            call_id,
            outcome="ok" if response.status_code < 400 else "error",
            http_status=response.status_code,
            first_byte_at=done,
            last_byte_at=done,
            prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"),
        )
        return Response(
            content,
            status_code=response.status_code,
            headers=headers,
            media_type=response.headers.get("content-type", "application/json"),
        )

    return StreamingResponse(
        _pass_through(response, lease, store, call_id),
        status_code=response.status_code,
        headers={**headers, "cache-control": "no-cache", "x-accel-buffering": "no"},
        media_type=response.headers.get("content-type", "text/event-stream"),
    )


async def _pass_through(
    response: httpx.Response, lease: Lease, store: Store, call_id: int
) -> AsyncIterator[bytes]:
    first_byte_at: float | None = None
    tail = b""
    outcome, error_code, status = "ok", None, response.status_code
    try:
        async for chunk in response.aiter_raw():
            if first_byte_at is None:
                first_byte_at = time.time()
            tail = (tail + chunk)[-_KEEP_TAIL:]
            yield chunk
    except httpx.HTTPError as exc:
        error = _engine_failed(lease, exc)
        outcome, error_code, status = "error", error.code, error.status
        log.error("%s", error.message)
        yield _sse_error(error)
    except BaseException:  # the client went away, or fitbox is stopping
        outcome = "interrupted"
        raise
    finally:
        await response.aclose()
        lease.release()
        usage = _usage(tail)
        _record(
            store,
            call_id,
            outcome=outcome if status < 400 or outcome != "ok" else "error",
            http_status=status,
            error_code=error_code,
            first_byte_at=first_byte_at,
            last_byte_at=time.time(),
            prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"),
        )
