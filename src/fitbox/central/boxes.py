"""One box managed from the centre: ``GET|POST /v1/fleet/boxes/{id}/limits`` reads and sets
the central tier of the box's limits through the box's own ``/v1/limits`` (with the box's
admin key the central holds). The box decides: a value above its own tier is refused by the
box, and its answer (status and OpenAI-shaped body) reaches the caller as the box sent it."""

from __future__ import annotations

from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from fitbox.central.mirror import BoxLink, Fleet
from fitbox.errors import EngineFailed, InvalidRequest, RouteNotFound

# a box that is down is said at once; one that answers has a while (it reads its probes)
LIMITS_TIMEOUT = httpx.Timeout(30.0, connect=5.0)


def the_box(fleet: Fleet, name: str) -> BoxLink:
    link = fleet.find(name)
    if link is None:
        raise RouteNotFound(
            f"No box {name!r} in this fleet; GET /v1/fleet lists them.",
            param="box_id",
            code="box_not_found",
        )
    return link


async def _ask(
    fleet: Fleet, link: BoxLink, method: str, path: str, body: dict[str, Any] | None = None
) -> Response:
    try:
        response = await fleet.client.request(
            method,
            f"{link.record.url}{path}",
            json=body,
            headers=link.headers,
            timeout=LIMITS_TIMEOUT,
        )
        answer = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise EngineFailed(
            f"The box {link.record.box_id} ({link.record.url}) did not answer "
            f"{method} {path}: {type(exc).__name__}; GET /v1/fleet shows its "
            "state.",
            param="box_id",
            code="box_unreachable",
        ) from None
    return JSONResponse(
        answer, status_code=response.status_code, headers={"x-fitbox-box": link.record.box_id}
    )


async def limits(request: Request) -> Response:
    fleet: Fleet = request.app.state.fleet
    link = the_box(fleet, request.path_params["box_id"])
    if request.method == "GET":
        return await _ask(fleet, link, "GET", "/v1/limits")
    try:
        body = await request.json()
    except ValueError:
        raise InvalidRequest("The body is not JSON.") from None
    if not isinstance(body, dict):
        raise InvalidRequest(
            "The body must be a JSON object of limits: ram_max, vram_max, "
            "cpu_max, storage_max (null clears one)."
        )
    if "tier" in body:
        raise InvalidRequest(
            "The central sets the central tier only; the box tier is the "
            "box's own (POST /v1/limits on the box).",
            param="tier",
        )
    return await _ask(fleet, link, "POST", "/v1/limits", {**body, "tier": "central"})
