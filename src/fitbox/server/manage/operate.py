"""Management routes for operators and scripts: what is resident, what the disks hold, and
the operator actions (load, unload, pin, unpin, refresh-models), each recorded."""

from __future__ import annotations

import os
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from fitbox.box.box import Box
from fitbox.box.drives import role_of
from fitbox.box.transfers import pull_from_box
from fitbox.core.reap import DriveRole
from fitbox.errors import Conflict, EngineFailed, FitboxError, InvalidRequest, RouteNotFound
from fitbox.models.box_pull import PullRefused, parse_box_spec
from fitbox.models.pull import PullError
from fitbox.probe.disk import read_drive
from fitbox.server.door.bodies import json_body
from fitbox.store.db import Store

ACTIONS = (
    "load",
    "unload",
    "pin",
    "unpin",
    "refresh-models",
    "clear-failed",
    "pull-model",
    "reap-to-fit",
    "copy-to-central",
)
NO_MODEL = ("refresh-models", "reap-to-fit")  # actions whose body names no model


async def residents(request: Request) -> Response:
    box: Box = request.app.state.box
    return JSONResponse({"object": "list", "data": [r.describe() for r in box.residents()]})


async def queue(request: Request) -> Response:
    box: Box = request.app.state.box
    return JSONResponse({"object": "list", "data": box.queue()})


async def storage(request: Request) -> Response:
    """Drives holding model roots: capacity, free bytes, and the models on each."""
    box: Box = request.app.state.box
    drives: dict[int, dict[str, Any]] = {}
    for root in box.catalog.roots:
        if not root.is_dir():
            continue
        device = os.stat(root).st_dev
        usage = read_drive(root)
        role, why = role_of(root, box.catalog.roots, box.config.drive_roles)
        drive = drives.setdefault(
            device,
            {
                "roots": [],
                "total_bytes": usage.total,
                "free_bytes": usage.free,
                "role": role.value,
                "role_from": why,
                "models": [],
            },
        )
        drive["roots"].append(str(root))
    for artifact in box.catalog.artifacts():
        try:
            device = os.stat(artifact.path).st_dev
        except OSError:
            continue
        if device in drives:
            drives[device]["models"].append(
                {"model": artifact.name, "bytes": os.stat(artifact.path).st_size}
            )
    return JSONResponse({"object": "list", "data": list(drives.values())})


async def operator_action(request: Request) -> Response:
    """POST /v1/operator/{action} {"model": name} (no body for refresh-models)."""
    box: Box = request.app.state.box
    store: Store = request.app.state.store
    action = request.path_params["action"]
    if action not in ACTIONS:
        raise RouteNotFound(f"No operator action {action!r}; there are {', '.join(ACTIONS)}.")
    target, body = None, dict[str, Any]()
    if action == "reap-to-fit":
        _, body = await json_body(request, {"bytes": int}, empty=True)
    elif action not in NO_MODEL:
        _, body = await json_body(request, {"model": str}, empty=True)
        target = body["model"]
    else:  # read all the same: a body that is no JSON object is refused here as anywhere
        await json_body(request, empty=True)
    key = getattr(request.state, "api_key", None)
    origin = request.client.host if request.client else None
    result = await perform(box, store, action, target, origin, key.key_id if key else None, body)
    return JSONResponse(result)


async def perform(
    box: Box,
    store: Store,
    action: str,
    target: str | None,
    origin: str | None,
    key_id: str | None,
    body: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Apply an operator action and record it, done or failed (the HTTP route and MCP).
    ``body``: the request's other fields (pull-model's ``source_key``)."""
    try:
        if action == "pull-model":
            assert target is not None
            result = await _pull_model(box, store, target, (body or {}).get("source_key"))
        elif action == "reap-to-fit":
            result = await _reap(box, int((body or {})["bytes"]), origin, key_id)
        elif action == "copy-to-central":
            assert target is not None
            result = await _copy_to_central(box, target)
        else:
            result = await _apply(box, action, target)
    except FitboxError as exc:
        store.operator_action(action, target, origin, key_id, "error", exc.message)
        raise
    store.operator_action(action, target, origin, key_id, "ok")
    return {"action": action, "model": target, **result}


async def _pull_model(box: Box, store: Store, spec: str, key: object) -> dict[str, Any]:
    """{"model": "box://HOST:PORT/MODEL", "source_key": KEY?}: into the first model root."""
    if key is not None and not isinstance(key, str):
        raise InvalidRequest("'source_key' must be a string.", param="source_key")
    try:  # a spec that names no box is the caller's mistake, refused before any transfer
        parse_box_spec(spec)
    except PullError as exc:
        raise InvalidRequest(
            f"{exc}: pull-model takes another fitbox's model as box://HOST:PORT/MODEL "
            "(e.g. box://10.0.0.5:8080/Qwen3-8B-Q4_K_M).",
            param="model",
            code="invalid_pull_spec",
        ) from None
    dest = box.catalog.roots[0]
    limit = box.prefs.cap("storage_max")
    make_room = None
    if box.movers.on("reap_to_fit") and (dest, DriveRole.WORKER) in box.movers.roles():

        def make_room(needed: int) -> None:  # called from the pull's thread
            anyio.from_thread.run(box.movers.reap, dest, needed, f"room to pull {spec}")

    try:
        outcomes = await anyio.to_thread.run_sync(
            lambda: pull_from_box(
                spec, dest, store, key=key, storage_max=limit, make_room=make_room
            )
        )
    except PullRefused as exc:
        raise Conflict(str(exc), param="model", code="pull_refused") from None
    except PullError as exc:
        raise EngineFailed(str(exc), param="model", code="pull_failed") from None
    box.catalog.refresh()
    return {
        "files": [
            {
                "path": str(o.path),
                "bytes": o.size,
                "sha256": o.sha256,
                "seconds": round(o.seconds, 3),
            }
            for o in outcomes
        ]
    }


async def _reap(box: Box, need: int, origin: str | None, key_id: str | None) -> dict[str, Any]:
    """{"bytes": N}: free N bytes on the worker drive (reap_to_fit, as an operator action)."""
    worker = box.movers.root_with(DriveRole.WORKER)
    if need < 0:
        raise InvalidRequest("'bytes' must be 0 or more.", param="bytes")
    if worker is None:
        raise Conflict(
            "No model root is on a worker drive (drive_roles), so nothing can be reaped.",
            code="no_worker_drive",
        )
    if box.store is None:
        raise Conflict("This box keeps no store, so no copy's hash is known.", code="no_store")
    plan = await box.movers.reap(worker, need, "operator action", origin, key_id)
    return {
        "root": str(worker),
        "freed_bytes": plan.freed,
        "short_by_bytes": plan.short_by,
        "removed": [path for c in plan.victims for path in c.files],  # every shard
        "kept": [{"path": c.path, "why": why.value} for c, why in plan.kept],
    }


async def _copy_to_central(box: Box, name: str) -> dict[str, Any]:
    """{"model": name}: copy a worker-only model to the central drive now."""
    artifact = box.catalog.resolve(name)
    if box.movers.root_with(DriveRole.CENTRAL) is None:
        raise Conflict(
            "No model root is on a central drive (drive_roles).", code="no_central_drive"
        )
    if box.store is None:
        raise Conflict("This box keeps no store, so no copy's hash is known.", code="no_store")
    dest, why = await box.movers.copy_to_central(artifact)
    return {"copied_to": str(dest) if dest else None, "why": why}


async def _apply(box: Box, action: str, target: str | None) -> dict[str, Any]:
    if action == "refresh-models":
        box.catalog.refresh()
        return {"models": len(box.catalog.artifacts()), "not_servable": len(box.catalog.rejected)}
    assert target is not None
    if action == "clear-failed":
        if not box.clear_failed(target):
            raise Conflict(f"'{target}' is not marked failed.", param="model", code="not_failed")
        return {"cleared": True}
    if action == "load":
        return {"resident": (await box.load(target)).describe()}
    if action == "pin":  # kept across restarts: a pinned model is loaded again at start
        resident = await box.pin(target)
        await box.update_settings("pair", target, {"pinned": True})
        return {"resident": resident.describe()}
    if action == "unpin":
        await box.update_settings("pair", target, {"pinned": None})
        return {"resident": (await box.pin(target, pinned=False)).describe()}
    return {"resident": (await box.unload(target)).describe()}
