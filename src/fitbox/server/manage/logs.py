"""GET /v1/logs and /v1/logs/{name}: the engine children's log files, for admins. A name is
a log file's name the box lists, never a path (box/supervision/logs.py); a follower reads on
from the ``x-fitbox-log-offset`` the last answer gave (``fitbox logs -f``)."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from fitbox.box.box import Box
from fitbox.errors import LogNotFound
from fitbox.server.door.bodies import query_number

TAIL_MAX = 100_000


async def list_logs(request: Request) -> Response:
    box: Box = request.app.state.box
    files = await asyncio.to_thread(box.child_logs)
    return JSONResponse({"object": "list", "data": [f.row() for f in files]})


async def read_log(request: Request) -> Response:
    box: Box = request.app.state.box
    name = request.path_params["name"]
    tail = int(query_number(request, "tail", 200, 1, TAIL_MAX))
    given = request.query_params.get("offset")
    offset = None if given in (None, "") else int(query_number(request, "offset", 0, 0, 2**62))
    piece = await asyncio.to_thread(box.child_log, name, offset, tail)
    if piece is None:
        raise LogNotFound(
            f"No engine log is named '{name}'. GET /v1/logs lists the names.", param="name"
        )
    return Response(
        piece.text,
        media_type="text/plain; charset=utf-8",
        headers={
            "x-fitbox-log-offset": str(piece.end),
            "x-fitbox-log-size": str(piece.size),
            "cache-control": "no-store",
        },
    )
