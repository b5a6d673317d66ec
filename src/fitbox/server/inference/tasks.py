"""A task call (speech, transcription, images) served through the same door as chat.

The route's handler (server/inference/audio.py, …) checks the client's fields and spools
its uploads; ``serve_task`` then opens the call in the box as any call (its row, its name,
the route its model's engine serves, the engine's environment: box/serving.py), places it
(evicting by bytes, never a serving model; queued like chat), and sends the child the JSON
the handler wrote: the client's fields, ``file`` the spooled upload, ``call`` a token the
child files its figures under. The reply is relayed as the child makes it (a stream of
audio, SSE events) or whole, hashed and counted on the way, and kept in the artifact dir
(server/door/artifacts.py). Once it ended, the call row gets every input's and output's
bytes and sha256 and the runner's figures (audio seconds in or out, pixels), before its last
byte leaves. A task whose reply holds several files (images) says how to keep them
(``Task.outputs``): each is kept and recorded on its own, and the client gets the reply
that function made (a URL in place of a file's bytes).
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from fitbox.box.box import Box
from fitbox.box.calls import Call
from fitbox.box.serving import Order
from fitbox.config import Config
from fitbox.engines.http1 import EngineConnectionError, EngineResponse
from fitbox.errors import FitboxError
from fitbox.server.door import timing
from fitbox.server.door.artifacts import Artifacts, Output
from fitbox.server.door.auth import is_insider
from fitbox.server.door.errors import body_for
from fitbox.server.inference.engine_errors import client_status, engine_error_body, retry_headers
from fitbox.server.inference.openai import allowed_models, request_id, via_central

log = logging.getLogger(__name__)
# a whole reply made into the client's, and the records of the outputs kept from it
Keeper = Callable[[bytes, Artifacts], tuple[bytes, list[dict[str, Any]]]]


@dataclass
class Task:
    """A task call as its handler made it."""

    path: str  # the engine route
    body: dict[str, Any]  # what the child gets (``model`` included)
    ext: str  # the output's file extension in the artifact dir
    stream: bool = False  # the client asked for a stream (the row's flag)
    inputs: list[dict[str, Any]] = field(default_factory=list)  # role, name, bytes, sha256
    cleanup: Callable[[], None] = lambda: None  # its spooled uploads removed: called once,
    # when its reply has ended (or failed), however it ended
    outputs: Keeper | None = None  # a whole reply's files kept one by one (else: as one)
    # its expected work in its runner's units (audio seconds to transcribe, characters to
    # speak, images to make): its ETA in the queue (box/task_speeds.py); None: unknown
    work: float | None = None
    measure: str | None = None  # the runner's figure that measures its work once it ended

    def done(self) -> None:
        cleanup, self.cleanup = self.cleanup, lambda: None
        cleanup()


def artifacts_of(request: Request) -> Artifacts:
    """The app's artifact dir (made once, from its settings)."""
    state = request.app.state
    found = getattr(state, "artifacts", None)
    if found is None:
        config: Config = state.config
        found = Artifacts(config.artifact_dir, config.artifact_max_age, config.artifact_max)
        state.artifacts = found
    return found


async def serve_task(request: Request, task: Task) -> Response:
    """The task call served; its uploads are removed once its reply ended (``Task.done``)."""
    streamed = False
    try:
        response = await _served(request, task)
        streamed = isinstance(response, StreamingResponse)
        return response
    finally:
        if not streamed:
            task.done()


async def _served(request: Request, task: Task) -> Response:
    box: Box = request.app.state.box
    token = secrets.token_hex(8)
    body = {**task.body, "call": token, "stream": task.stream}
    order = Order(
        task.path,
        body,
        json.dumps(body).encode(),
        request_id(request),
        allowed_models(request),
        accept=request.headers.get("accept", "*/*"),
        central_key=via_central(request),
        work=task.work,
    )
    served = box.serving.open(order)
    call = served.call
    setattr(request.state, timing.STAMPS_STATE, call.stamps)
    try:
        answer = await served.serve()  # its row ends on a refusal, before it is raised
    except FitboxError:
        call.files_recorded(task.inputs, {})
        raise
    response = answer.response
    headers = {
        **served.headers,
        "x-fitbox-model": answer.resident.artifact.name,
        "x-fitbox-device": answer.resident.device,
    }
    if response.status >= 400:
        return await _refused(call, response, headers, task)
    if task.outputs is not None:
        return await _kept(call, response, token, task, headers, artifacts_of(request))
    output = artifacts_of(request).output(call.id, task.ext)
    media_type = response.headers.get("content-type", "application/octet-stream")
    if "chunked" not in response.headers.get("transfer-encoding", "").lower():
        content = await call.read(response)
        output.write(content)
        call.answered(response.status, content)
        await _recorded(call, token, task, output)
        return Response(
            content, status_code=response.status, headers=headers, media_type=media_type
        )
    stream = _relayed(call, response, token, task, output, is_insider(request))
    return StreamingResponse(
        stream,
        headers={**headers, "cache-control": "no-cache", "x-accel-buffering": "no"},
        media_type=media_type,
    )


async def _refused(
    call: Call, response: EngineResponse, headers: dict[str, str], task: Task
) -> Response:
    """The child refused the call (its input is not audio, a voice it lacks…)."""
    try:
        content = await call.read(response)
    except FitboxError as exc:
        call.failed(exc)
        call.files_recorded(task.inputs, {})
        await call.finished()
        raise
    body = engine_error_body(response.status, content, call.resident.artifact.name)
    status = client_status(response.status, body)
    call.refused_by_engine(status, body["error"]["code"])
    call.files_recorded(task.inputs, {})
    await call.finished()
    return JSONResponse(body, status_code=status, headers={**headers, **retry_headers(status)})


async def _kept(
    call: Call,
    response: EngineResponse,
    token: str,
    task: Task,
    headers: dict[str, str],
    artifacts: Artifacts,
) -> Response:
    """A whole reply whose files ``task.outputs`` keeps one by one; the client gets the
    reply it made, once the row holds every file and figure (or the reason it could not be
    made, the call failed: a reply the child garbled, a URL with no dir to keep it in)."""
    assert task.outputs is not None
    content = await call.read(response)
    try:
        reply, kept = task.outputs(content, artifacts)
    except FitboxError as error:
        call.failed(error)
        call.files_recorded(task.inputs, {})
        await call.finished()
        raise
    call.answered(response.status, content)  # the child's own reply: its timings
    call.files_recorded([*task.inputs, *kept], await _measured(call, token))
    await call.finished()
    media_type = response.headers.get("content-type", "application/json")
    return Response(reply, status_code=response.status, headers=headers, media_type=media_type)


async def _recorded(call: Call, token: str, task: Task, output: Output) -> None:
    """The call's files and figures on its row, committed (its last byte may go)."""
    figures = await _measured(call, token)
    call.files_recorded([*task.inputs, output.close()], figures)
    call.worked(figures.get(task.measure) if task.measure else None)
    await call.finished()


async def _measured(call: Call, token: str) -> dict[str, float]:
    """What the runner measured for the call (its audio seconds); {} when its child is
    gone (stopped since) or says nothing."""
    child = call.resident.child if call.lease is not None else None
    if child is None:
        return {}
    try:
        status, content = await child.pool.get(f"/measured/{token}")
        found = json.loads(content) if status == 200 else None
    except (EngineConnectionError, OSError, ValueError):
        return {}
    if not isinstance(found, dict):
        return {}
    return {str(k): float(v) for k, v in found.items() if isinstance(v, int | float)}


async def _relayed(
    call: Call,
    response: EngineResponse,
    token: str,
    task: Task,
    output: Output,
    insider: bool,
) -> AsyncIterator[bytes]:
    """The child's stream as it comes, one piece behind: the last piece leaves only once
    the row (files, figures) is stored. A failure mid-stream ends an event stream with an
    error event; an audio stream, whose bytes cannot carry one, is broken off unfinished
    (no last chunk), so its client cannot take it for a whole file."""
    try:
        async for piece in _pieces(call, response, token, task, output, insider):
            yield piece
    finally:
        task.done()


async def _pieces(
    call: Call,
    response: EngineResponse,
    token: str,
    task: Task,
    output: Output,
    insider: bool,
) -> AsyncIterator[bytes]:
    held = b""
    try:
        async for chunk in call.relay(response):
            output.write(chunk)
            if held:
                yield held
            held = chunk
    except FitboxError as error:
        log.error("%s", error.message)
        call.files_recorded([*task.inputs, output.close()], {})
        await call.finished()
        if held:
            yield held
        if not response.headers.get("content-type", "").startswith("text/event-stream"):
            raise
        yield b"data: " + json.dumps(body_for(error, insider)).encode() + b"\n\n"
        return
    await _recorded(call, token, task, output)
    if held:
        yield held
