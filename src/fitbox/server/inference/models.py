"""``GET /v1/models`` and ``GET /v1/models/{id}``: OpenAI's model objects, with fitbox's own
fields beside them and llama-server's ``meta`` (from the header facts fitbox already has;
``n_ctx`` only while a child holds a window). Files and folders the box cannot serve (one
it may not read, a GGUF it cannot size) are listed beside ``data`` in ``not_servable``,
with why; a known model whose file turned unreadable keeps its entry, with its
``problem``."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from fitbox.box.box import Box
from fitbox.box.helper.menu import HELPER
from fitbox.box.resident import Resident
from fitbox.errors import FitboxError, ModelNotFound, ModelNotServable
from fitbox.models.catalog import RESCAN_AT_MOST_EVERY_S, Artifact
from fitbox.server.door.auth import is_insider
from fitbox.server.inference.openai import allowed_models

UNSERVABLE_FOR_OUTSIDERS = (
    "fitbox cannot serve this file (why is shown to the box itself and to admin keys)"
)


def _entry(box: Box, artifact: Artifact, r: Resident | None, insider: bool) -> dict[str, Any]:
    shape = artifact.facts.shape
    problem = box.catalog.problem(artifact.name)
    try:
        created = artifact.identity().mtime_ns // 1_000_000_000
    except OSError:  # gone since the scan: its entry goes at the next one
        created = 0
    return {
        "id": artifact.name,
        "object": "model",
        "created": created,
        "problem": problem if insider or problem is None else UNSERVABLE_FOR_OUTSIDERS,
        "owned_by": "fitbox",
        "aliases": box.catalog.aliases_of(artifact.name),
        "resident": r is not None,
        "state": r.state.value
        if r
        else ("failed" if box.crashes.failed(artifact.key) else "unloaded"),
        "device": r.device if r else None,
        "simulated": r.simulated if r else False,
        "footprint_bytes": r.footprint.total if r else None,
        "size_bytes": shape.weights_bytes,
        "architecture": artifact.facts.architecture,
        "vision": artifact.vision,  # reads image_url parts (server/door/bodies.py)
        "task": artifact.task,  # transcription, speech…: a task model (models/task_models.py)
        "meta": {
            "n_ctx": r.window if r else None,
            "n_ctx_train": shape.n_ctx_train,
            "n_params": artifact.facts.n_params,
            "n_vocab": shape.n_vocab,
            "n_embd": shape.n_embd,
            "size": shape.weights_bytes,
        },
    }


async def list_models(request: Request) -> Response:
    box: Box = request.app.state.box
    box.catalog.refresh(max_age=RESCAN_AT_MOST_EVERY_S)
    resident = {r.key: r for r in box.residents()}
    allowed = allowed_models(request)
    insider = is_insider(request)  # a reason names the box's paths, owners and modes
    data = [
        _entry(box, artifact, resident.get(artifact.key), insider)
        for artifact in box.catalog.artifacts()
        if allowed is None or artifact.name in allowed
    ]
    not_servable: list[dict[str, str | None]] = [
        {"name": bad.name, "path": str(bad.path), "reason": bad.reason}
        if insider
        else {"name": bad.name, "reason": UNSERVABLE_FOR_OUTSIDERS}
        for bad in box.catalog.rejected
        if bad.name is not None and (allowed is None or bad.name in allowed)
    ]
    if insider:  # a folder fitbox cannot list has no model name: the operator's alone
        not_servable += [
            {"name": None, "path": str(bad.path), "reason": bad.reason}
            for bad in box.catalog.rejected
            if bad.name is None
        ]
    data.append(helper_entry())  # always: any caller may chat with it
    return JSONResponse({"object": "list", "data": data, "not_servable": not_servable})


def helper_entry() -> dict[str, Any]:
    """fitbox-helper's entry: a model name with no weights behind it (box/helper/)."""
    return {
        "id": HELPER,
        "object": "model",
        "created": 0,
        "owned_by": "fitbox",
        "weights": False,  # not a model file: chat with it for menus over this box
        "description": "fitbox's helper: menus over this box (what is resident and why, why "
        "a model is refused, settings, tool configs); chat with it, say 'menu'",
        "aliases": [],
        "resident": False,
        "state": "helper",
        "device": None,
        "simulated": False,
        "footprint_bytes": None,
        "size_bytes": 0,
        "architecture": None,
        "vision": False,
        "task": None,
        "meta": None,
    }


async def show_model(request: Request) -> Response:
    """One model by its name or an alias of it (OpenAI's ``models.retrieve``); a family
    name is its first variant. The entry keeps the name asked as its ``id``."""
    box: Box = request.app.state.box
    asked = request.path_params["model_id"]
    if asked == HELPER:
        return JSONResponse(helper_entry())
    try:
        artifact = box.catalog.variants(asked)[0]
    except ModelNotServable:
        raise
    except FitboxError:
        raise ModelNotFound(
            f"The model '{asked}' does not exist on this box; GET /v1/models lists those it has.",
            param="model",
        ) from None
    allowed = allowed_models(request)
    if allowed is not None and not {asked, artifact.name} & set(allowed):
        raise ModelNotFound(f"The model '{asked}' does not exist for this key.", param="model")
    resident = next((r for r in box.residents() if r.key == artifact.key), None)
    entry = _entry(box, artifact, resident, is_insider(request))
    entry["id"] = asked
    return JSONResponse(entry, headers={"x-fitbox-model": artifact.name})
