"""One box managed from the centre: ``PATCH /v1/fleet/boxes/{id}`` names or drains it,
``DELETE`` removes it; ``GET|POST /v1/fleet/boxes/{id}/limits`` reads and sets
the central tier of the box's limits through the box's own ``/v1/limits`` (with the box's
admin key the central holds). The box decides: a value above its own tier is refused by the
box, and its answer (status and OpenAI-shaped body) reaches the caller as the box sent it."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from fitbox.central.mirror import BoxLink, Fleet
from fitbox.central.store import CentralStore
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


async def change(request: Request) -> Response:
    """PATCH {"name": text or null, "draining": bool}: a person's name for the box (null
    gives it back the host name it registers) and drain (bare-name calls go elsewhere)."""
    fleet: Fleet = request.app.state.fleet
    link = the_box(fleet, request.path_params["box_id"])
    try:
        body = await request.json()
    except ValueError:
        raise InvalidRequest("The body is not JSON.") from None
    if not isinstance(body, dict) or not body or set(body) - {"name", "draining"}:
        raise InvalidRequest('The body is {"name": text or null, "draining": true or false}.')
    name, draining = body.get("name"), body.get("draining")
    if "name" in body and not (name is None or (isinstance(name, str) and name.strip())):
        raise InvalidRequest("'name' is text, or null for the box's own.", param="name")
    if "draining" in body and not isinstance(draining, bool):
        raise InvalidRequest("'draining' is true or false.", param="draining")
    store: CentralStore = request.app.state.store
    box_id = link.record.box_id
    if "name" in body:
        await asyncio.to_thread(store.set_box, box_id, "label", name.strip() if name else None)
    if "draining" in body:
        await asyncio.to_thread(store.set_box, box_id, "draining", 1 if draining else 0)
    records = await asyncio.to_thread(store.boxes)
    link.record = next(r for r in records if r.box_id == box_id)
    return JSONResponse(link.describe())


async def remove(request: Request) -> Response:
    """DELETE: the central forgets the box (its key, its proof, its cursors; its mirrored
    rows stay). A box still running joins again at its next start as a new registration."""
    fleet: Fleet = request.app.state.fleet
    box_id = the_box(fleet, request.path_params["box_id"]).record.box_id
    store: CentralStore = request.app.state.store
    await fleet.forget(box_id)
    await asyncio.to_thread(store.remove, box_id)
    return JSONResponse({"box_id": box_id, "removed": True})
