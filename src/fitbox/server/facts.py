"""``POST /v1/facts/import`` (management): footprints another box measured for a file with
the same sha256, as a central offers them. Body: ``{"origin_box": ID, "sha256": HEX,
"footprints": [ROW, ...]}``, each row a ``measured_footprints`` row of the box that measured
it. The box prices from them at once; each is labelled with its origin (``GET /v1/plan``
shows ``"basis": "imported"`` and ``measured_by``). Matching and filing: box/imports.py."""

from __future__ import annotations

import re
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from fitbox.box.box import Box
from fitbox.box.imports import BadFact, footprint, same_bytes
from fitbox.errors import InvalidRequest, RouteNotFound
from fitbox.server.bodies import json_body
from fitbox.server.transfer import hash_keeper
from fitbox.store.db import Store

SHA256 = re.compile(r"^[0-9a-f]{64}$")
MOST_FOOTPRINTS = 1000


def _offer(body: dict[str, Any], own_id: str | None) -> tuple[str, str, list[Any], int]:
    origin, sha256, rows = body.get("origin_box"), body.get("sha256"), body.get("footprints")
    if not isinstance(origin, str) or not origin:
        raise InvalidRequest("'origin_box' must name the box that measured the footprints.",
                             param="origin_box")  # fmt: skip
    if origin == own_id:
        raise InvalidRequest("These footprints were measured by this box itself: nothing to "
                             "import.", param="origin_box")  # fmt: skip
    if not isinstance(sha256, str) or not SHA256.match(sha256):
        raise InvalidRequest("'sha256' must be the file's sha256, 64 lowercase hex digits.",
                             param="sha256")  # fmt: skip
    if not isinstance(rows, list) or not rows or len(rows) > MOST_FOOTPRINTS:
        raise InvalidRequest(f"'footprints' must be a list of 1..{MOST_FOOTPRINTS} rows.",
                             param="footprints")  # fmt: skip
    sizes = [row.get("artifact_size") if isinstance(row, dict) else None for row in rows]
    size = sizes[0]
    if (isinstance(size, bool) or not isinstance(size, int) or size <= 0
            or any(other != size for other in sizes)):  # fmt: skip
        raise InvalidRequest("Every footprint must carry the same 'artifact_size' (the file's "
                             "bytes, one file per offer).", param="artifact_size")  # fmt: skip
    return origin, sha256, rows, size


async def import_facts(request: Request) -> Response:
    box: Box = request.app.state.box
    store: Store = request.app.state.store
    _, body = await json_body(request)
    origin, sha256, rows, size = _offer(body, store.box_id())
    keeper, artifacts = hash_keeper(request), box.catalog.artifacts()
    files, checked = await anyio.to_thread.run_sync(  # stats, and hashing a file once
        lambda: same_bytes(artifacts, size, sha256, keeper.kept))
    if not files:
        raise RouteNotFound(f"No file on this box has sha256 {sha256} ({checked} file(s) of "
                            f"{size} bytes checked): these facts are not about a file here.",
                            param="sha256", code="no_such_file")  # fmt: skip
    taken = []
    for artifact in files:
        identity = artifact.identity()
        try:
            measured = [footprint(row, identity, origin) for row in rows]
        except BadFact as exc:
            raise InvalidRequest(f"A footprint cannot be imported: {exc}.",
                                 param=exc.field) from None  # fmt: skip
        for m in measured:
            box.facts.footprint_imported(m)
        taken.append({"model": artifact.name, "footprints": len(measured)})
    return JSONResponse({"origin_box": origin, "sha256": sha256, "files": taken})
