"""A chat naming ``fitbox-helper``, as HTTP: parse → serve → frame, with no placement and no
engine. The box answers it (box/helper/); this file opens its row, tells the box who is
calling (the key's model limit, whether a key came, the base URL the caller reached) and
hands it the one way to change a setting: ``POST /v1/settings/box|pair`` as that route
makes it (server/manage/settings.py), after the door admits the caller for that route
(server/door/auth.py ``admit``, as MCP's tools are admitted). An inference key is refused
there like on the route itself; the refusal is said in the reply (the conversation goes on,
the menu with it), its status and code named. The reply is a chat completion, or its chunks
and ``data: [DONE]`` (usage last when ``stream_options.include_usage`` asks)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from fitbox.box.box import Box
from fitbox.box.helper.answers import Caller
from fitbox.box.helper.helper import Changer, Helper, Reply
from fitbox.box.helper.menu import HELPER
from fitbox.errors import FitboxError
from fitbox.server.door import timing
from fitbox.server.door.auth import admit
from fitbox.server.manage import settings
from fitbox.server.manage.joining import central_key_of
from fitbox.server.streams.events import done_frame

__all__ = ["HELPER", "helper_reply"]


async def helper_reply(
    request: Request, path: str, body: dict[str, Any], request_id: str
) -> Response:
    box: Box = request.app.state.box
    helper: Helper = request.app.state.helper
    stream = body.get("stream") is True
    said = central_key_of(request.headers, getattr(request.state, "api_key", None))
    call = box.calls.open(path, HELPER, stream, request_id, said)
    setattr(request.state, timing.STAMPS_STATE, call.stamps)
    try:
        reply = await helper.reply(
            body["messages"], _caller(request, request_id), _changer(request)
        )
    except FitboxError as error:
        call.failed(error)
        await call.finished()
        raise
    except BaseException:
        call.interrupted()
        raise
    call.helped(200)
    await call.finished()  # the whole reply is known: its row is ended before its first byte
    ident, created = f"chatcmpl-helper-{request_id}", int(time.time())
    if not stream:
        return JSONResponse(_completion(reply, ident, created))
    usage = isinstance(body.get("stream_options"), dict) and bool(
        body["stream_options"].get("include_usage")
    )
    frames = _chunks(reply, ident, created, usage, call.stamps)
    return StreamingResponse(
        frames,
        headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        media_type="text/event-stream",
    )


def _caller(request: Request, request_id: str) -> Caller:
    key = getattr(request.state, "api_key", None)
    return Caller(
        allowed=key.models if key is not None else None,
        keyed=key is not None,
        base_url=str(request.base_url).rstrip("/") + "/v1",
        request_id=request_id,
    )


def _changer(request: Request) -> Changer:
    """A change as its management route makes it, for this caller: admitted by the door's
    rule for that route with the key this call came with, or refused as that route would."""

    async def change(scope: str, model: str, body: dict[str, Any]) -> dict[str, Any]:
        gate = getattr(request.app.state, "gate", None)
        if gate is not None:
            known = getattr(request.state, "api_key", None)  # checked at the door already
            admit(
                f"/v1/settings/{scope}",
                request.client.host if request.client else None,
                {k.lower(): v for k, v in request.headers.items()},
                gate,
                "POST",
                scheme=request.url.scheme,
                verify=lambda *_: known,
            )
        if scope == "box":
            return await settings.set_box(request, body)
        return await settings.set_pair(request, model, body)

    return change


USAGE = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}  # no weights ran


def _completion(reply: Reply, ident: str, created: int) -> dict[str, Any]:
    return {
        "id": ident,
        "object": "chat.completion",
        "created": created,
        "model": HELPER,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": reply.text},
                "finish_reason": "stop",
            }
        ],
        "usage": USAGE,
    }


def _chunks(
    reply: Reply, ident: str, created: int, usage: bool, stamps: dict[str, float | None]
) -> Iterator[bytes]:
    """The reply as chat chunks: the role, a chunk a line, the stop, the usage if asked."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        event = {
            "id": ident,
            "object": "chat.completion.chunk",
            "created": created,
            "model": HELPER,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return b"data: " + json.dumps(event).encode() + b"\n\n"

    yield chunk({"role": "assistant", "content": ""})
    for line in reply.text.splitlines(keepends=True):
        yield chunk({"content": line})
    yield chunk({}, "stop")
    if usage:
        event = {
            "id": ident,
            "object": "chat.completion.chunk",
            "created": created,
            "model": HELPER,
            "choices": [],
            "usage": USAGE,
        }
        yield b"data: " + json.dumps(event).encode() + b"\n\n"
    yield done_frame(stamps)
