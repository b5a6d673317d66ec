"""``POST /v1/facts/import`` (management): facts another box measured for a file with the
same sha256, as a central offers them. Body: ``{"origin_box": ID, "sha256": HEX,
"footprints": [ROW, ...], "refused_windows": [ROW, ...], "speeds": [ROW, ...]}`` (one list
at least), each row a ``measured_footprints``, ``refused_windows`` or ``measured_speeds`` row
of the box that measured it. The box prices from them at once; each is labelled with its
origin (``GET /v1/plan`` shows ``"basis": "imported"`` and ``measured_by`` for a footprint,
``refused_windows`` with each one's ``origin_box``, and ``speeds_measured_by``). Matching
and filing: box/imports.py."""

from __future__ import annotations

import re
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from fitbox.box.box import Box
from fitbox.box.imports import BadFact, footprint, refused_window, same_bytes, speed
from fitbox.errors import InvalidRequest, RouteNotFound
from fitbox.server.door.bodies import json_body
from fitbox.server.manage.transfer import hash_keeper

SHA256 = re.compile(r"^[0-9a-f]{64}$")
MOST_ROWS = 1000
KINDS = ("footprints", "refused_windows", "speeds")  # the offer's lists, in this order


def _offer(body: dict[str, Any], own_id: str | None) -> tuple[str, str, dict[str, list[Any]], int]:
    origin, sha256 = body.get("origin_box"), body.get("sha256")
    if not isinstance(origin, str) or not origin:
        raise InvalidRequest(
            "'origin_box' must name the box that measured the facts.", param="origin_box"
        )
    if origin == own_id:
        raise InvalidRequest(
            "These footprints were measured by this box itself: nothing to import.",
            param="origin_box",
        )
    if not isinstance(sha256, str) or not SHA256.match(sha256):
        raise InvalidRequest(
            "'sha256' must be the file's sha256, 64 lowercase hex digits.", param="sha256"
        )
    lists = {kind: body.get(kind) for kind in KINDS if body.get(kind) is not None}
    for kind, rows in lists.items():
        if not isinstance(rows, list) or len(rows) > MOST_ROWS:
            raise InvalidRequest(
                f"'{kind}' must be a list of at most {MOST_ROWS} rows.", param=kind
            )
    offered: dict[str, list[Any]] = {kind: rows for kind, rows in lists.items() if rows}
    if not offered:
        raise InvalidRequest(
            "The offer holds no fact: give 'footprints', 'refused_windows' "
            "or 'speeds', a list of one row at least.",
            param="footprints",
        )
    sizes = [
        row.get("artifact_size") if isinstance(row, dict) else None
        for rows in offered.values()
        for row in rows
    ]
    size = sizes[0]
    if (
        isinstance(size, bool)
        or not isinstance(size, int)
        or size <= 0
        or any(other != size for other in sizes)
    ):
        raise InvalidRequest(
            "Every row must carry the same 'artifact_size' (the file's bytes, one file per offer).",
            param="artifact_size",
        )
    return origin, sha256, offered, size


async def import_facts(request: Request) -> Response:
    box: Box = request.app.state.box
    _, body = await json_body(request)
    this_box: dict[str, str | None] = request.app.state.identity  # read once, at start
    origin, sha256, offered, size = _offer(body, this_box["box_id"])
    keeper, artifacts = hash_keeper(request), box.catalog.artifacts()
    files, checked = await anyio.to_thread.run_sync(  # stats, and hashing a file once
        lambda: same_bytes(artifacts, size, sha256, keeper.kept)
    )
    if not files:
        raise RouteNotFound(
            f"No file on this box has sha256 {sha256} ({checked} file(s) of "
            f"{size} bytes checked): these facts are not about a file here.",
            param="sha256",
            code="no_such_file",
        )
    taken = []
    for artifact in files:
        identity = artifact.identity()
        try:
            footprints = [footprint(r, identity, origin) for r in offered.get("footprints", [])]
            windows = [
                refused_window(r, identity, origin) for r in offered.get("refused_windows", [])
            ]
            speeds = [speed(r, identity, origin) for r in offered.get("speeds", [])]
        except BadFact as exc:
            raise InvalidRequest(f"A fact cannot be imported: {exc}.", param=exc.field) from None
        for m in footprints:
            box.facts.footprint_imported(m)
        for w in windows:
            box.facts.window_imported(w)
        for s in speeds:
            box.speeds.imported(s)
        counts = {
            "footprints": len(footprints),
            "refused_windows": len(windows),
            "speeds": len(speeds),
        }
        taken.append({"model": artifact.name, **{k: counts[k] for k in offered}})
    return JSONResponse({"origin_box": origin, "sha256": sha256, "files": taken})
