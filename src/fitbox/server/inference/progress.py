"""A streamed call that must wait for its model's load: its 200 at once, then keep-alive
comments (``: fitbox: loading``) until the model is ready, and, when the client opted in,
progress chunks it can show. A failure before the reply (the load, a refusal) ends the
stream with an SSE error event and ``data: [DONE]``: the status line is long gone.

A progress chunk is a chunk of the call's own kind with no choices and one extra field,
which the openai SDKs pass through (``chunk.model_extra["fitbox_progress"]``)::

    {"id": "fitbox-progress-7", "object": "chat.completion.chunk", "created": 1700000000,
     "model": "Qwen3-8B", "choices": [],
     "fitbox_progress": {"state": "loading", "queue_position": null, "seconds": 3.2,
                         "bytes_loaded": 3221225472, "bytes_total": 5368709120}}

``state`` is ``queued`` (waiting for room; ``queue_position`` 1 is next) or ``loading``
(``bytes_loaded`` of ``bytes_total``: engines/reading.py says how it is read).

Opting in: ``metadata.fitbox_progress`` true (or "true") in the body, else the key's
``progress`` setting, else the box's (box/preferences.py KEY_KNOBS).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request

from fitbox.box.box import Box
from fitbox.box.calls import Call
from fitbox.box.resident import Resident
from fitbox.box.serving import Answer
from fitbox.core.types import ResidentState
from fitbox.engines.reading import bytes_read
from fitbox.errors import FitboxError
from fitbox.server.door.errors import body_for
from fitbox.server.streams.events import done_frame

TICK_S = 1.0  # a keep-alive comment (or a progress chunk) this often while the call waits
KEEP_ALIVE = b": fitbox: loading the model\n\n"
PROGRESS_PATHS = ("/v1/chat/completions", "/v1/completions")
Relay = Callable[[Answer], AsyncGenerator[bytes, None]]
Start = Callable[[], Awaitable[Answer]]  # places the call and sends it (box/serving.py)


def wanted(request: Request, body: dict[str, Any]) -> bool:
    """Whether this call opted in to progress chunks (see the module's last paragraph).
    Only OpenAI chat and text completions: other streams' clients (Responses, Anthropic
    Messages) have no chunk of that shape, so they get the keep-alive comments only."""
    if request.url.path not in PROGRESS_PATHS:
        return False
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and "fitbox_progress" in metadata:
        return metadata["fitbox_progress"] in (True, "true", "1", "yes")
    box: Box = request.app.state.box
    key = getattr(request.state, "api_key", None)
    return bool(box.prefs.for_key(key.key_id if key else None)["progress"])


def progress_of(box: Box, call: Call, since: float) -> dict[str, Any]:
    """Where the call stands: its place in the queue, or how much of its model is in."""
    position = next((i + 1 for i, w in enumerate(box.queue()) if w["call_id"] == call.id), None)
    found: dict[str, Any] = {
        "state": "queued" if position else "loading",
        "queue_position": position,
        "seconds": round(time.time() - since, 3),
        "bytes_loaded": None,
        "bytes_total": None,
    }
    try:
        artifacts = {a.key: a for a in box.asks.named(call.model).artifacts}
    except FitboxError:
        return found
    for r in box.residents():
        if r.key in artifacts and r.state is ResidentState.STARTING:
            loaded, size = loaded_bytes(r)
            found |= {"bytes_loaded": loaded, "bytes_total": size}
            break
    return found


def loaded_bytes(resident: Resident) -> tuple[int, int]:
    """(bytes of its weights the loading child has read, all of them): for a progress
    chunk and the dashboard (engines/reading.py says how it is read)."""
    artifact = resident.artifact
    size = artifact.facts.shape.weights_bytes or artifact.path.stat().st_size
    pid = resident.child.pid if resident.child else None
    return (bytes_read(pid, artifact.path, size) if pid else 0), size


def _chunk(call: Call, progress: dict[str, Any]) -> bytes:
    kind = (
        "chat.completion.chunk"
        if call.endpoint.endswith("chat/completions")
        else ("text_completion")
    )
    chunk = {
        "id": f"fitbox-progress-{call.id}",
        "object": kind,
        "created": int(time.time()),
        "model": call.model,
        "choices": [],
        "fitbox_progress": progress,
    }
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def _abandoned(call: Call, task: asyncio.Future[Answer]) -> None:
    """A start whose client left: should it have placed the call all the same (a cancel
    can be lost in Python 3.11's ``wait_for``), its reply is closed and its lease let go."""
    if task.cancelled() or task.exception() is not None:  # (the exception is retrieved)
        return
    task.result().response.close()
    call.interrupted()


async def waiting_stream(
    box: Box,
    call: Call,
    start: Start,
    relay: Relay,
    progress: bool,
    insider: bool,
) -> AsyncIterator[bytes]:
    """The body of a stream whose 200 went before its model was ready. ``start`` places
    the call and sends it; ``relay`` is the engine's reply as the client gets it."""
    since = time.time()
    await call.written()  # the status line is the first byte: the row is stored first
    yield KEEP_ALIVE
    started = asyncio.ensure_future(start())
    try:
        while True:
            if progress:
                yield _chunk(call, progress_of(box, call, since))
            done, _ = await asyncio.wait({started}, timeout=TICK_S)
            if done:
                break
            if not progress:
                yield KEEP_ALIVE
        answer = started.result()
    except FitboxError as error:
        call.failed(error)
        await call.finished()  # the error event is the last byte: its row is stored first
        yield b"data: " + json.dumps(body_for(error, insider)).encode() + b"\n\n"
        yield done_frame(call.stamps)
        return
    except BaseException:  # the client went away, or fitbox is stopping
        started.cancel()
        started.add_done_callback(lambda task: _abandoned(call, task))
        call.interrupted()
        raise
    chunks = relay(answer)
    try:
        async for chunk in chunks:
            yield chunk
    finally:
        await chunks.aclose()  # now, not when collected: its end releases the call's lease
