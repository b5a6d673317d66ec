"""Management routes for the box's knobs and what the core sees: settings (box-wide and per
model), limits (capacity tiers), cores (claims) and verdicts (every rung priced).

Every change is persisted before it applies and recorded as an operator action."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from fitbox.box import limits as box_limits
from fitbox.box.box import Box
from fitbox.box.planning import report
from fitbox.box.preferences import (
    BOX_KNOBS,
    CENTRAL_TIER,
    KEY_KNOBS,
    LIMIT_KNOBS,
    PAIR_KNOBS,
    parse,
)
from fitbox.core.claims import claimable_count, reserved_core
from fitbox.core.pins import parse as parse_pins
from fitbox.core.verdicts import verdicts as price_all
from fitbox.errors import InvalidRequest
from fitbox.probe.host import read_core_busy
from fitbox.server.door.bodies import json_body
from fitbox.store.db import Store
from fitbox.store.keys import find_key
from fitbox.store.waits import read
from fitbox.units import format_bytes


async def _body(request: Request) -> Any:
    return (await json_body(request, empty=True))[1]


def _record(request: Request, action: str, target: str | None, detail: dict[str, Any]) -> None:
    store: Store = request.app.state.store
    key = getattr(request.state, "api_key", None)
    origin = request.client.host if request.client else None
    store.operator_action(
        action, target, origin, key.key_id if key else None, "ok", json.dumps(detail, default=str)
    )


def _box(request: Request) -> Box:
    box: Box = request.app.state.box
    return box


async def box_settings(request: Request) -> Response:
    """GET|POST /v1/settings/box: own (what was set), default (start-up), effective."""
    box = _box(request)
    if request.method == "POST":
        await set_box(request, await _body(request))
    defaults = {k: v for k, v in box.prefs.defaults().items() if k in BOX_KNOBS}
    effective = {k: v for k, v in box.prefs.effective().items() if k in BOX_KNOBS}
    return JSONResponse({"own": box.prefs.box, "default": defaults, "effective": effective})


async def set_box(request: Request, body: Any) -> dict[str, Any]:
    """POST /v1/settings/box's change (the helper's ``set`` makes it too, once the door
    admitted its caller for this route): parsed, kept, applied, recorded."""
    values = parse(BOX_KNOBS, body)
    await _box(request).update_settings("box", "", values)
    _record(request, "settings-box", None, values)
    return values


async def set_pair(request: Request, model: str, body: Any) -> dict[str, Any]:
    """POST /v1/settings/pair's change for ``model`` (the helper's ``set … for MODEL``)."""
    box = _box(request)
    box.catalog.variants(parse_pins(model).name)  # an unknown model is a 404, not a row
    values = parse(PAIR_KNOBS, body)
    await box.update_settings("pair", model, values)
    _record(request, "settings-pair", model, values)
    return values


def _pair_view(box: Box, model: str) -> dict[str, Any]:
    return {
        "model": model,
        "own": box.prefs.pairs.get(model, {}),
        "box": {k: v for k, v in box.prefs.effective().items() if k in PAIR_KNOBS},
        "effective": {k: v for k, v in box.prefs.effective(model).items() if k in PAIR_KNOBS},
    }


async def pair_settings(request: Request) -> Response:
    """GET /v1/settings/pair[?model=] and POST {"model": name, knob: value, ...}."""
    box = _box(request)
    if request.method == "POST":
        body = await _body(request)
        model = body.pop("model", None) if isinstance(body, dict) else None
        if not isinstance(model, str) or not model:
            raise InvalidRequest("Field 'model' is required.", param="model")
        await set_pair(request, model, body)
        return JSONResponse(_pair_view(box, model))
    model = request.query_params.get("model")
    if model:
        return JSONResponse(_pair_view(box, model))
    return JSONResponse({"object": "list", "data": [_pair_view(box, m) for m in box.prefs.pairs]})


TIERS = ("box", "central")


async def limits(request: Request) -> Response:
    """GET|POST /v1/limits: the tiers; a value above its parent tier is refused, named.
    POST sets the box tier, or with ``"tier": "central"`` the central tier (what a central
    allots this box; it must stay at or under the box tier)."""
    box = _box(request)
    if request.method == "POST":
        body = await _body(request)
        tier = body.pop("tier", "box") if isinstance(body, dict) else "box"
        if tier not in TIERS:
            raise InvalidRequest(
                f"'tier' must be one of {', '.join(TIERS)}; got {tier!r}.", param="tier"
            )
        values = parse(LIMIT_KNOBS, body)
        prefix = CENTRAL_TIER if tier == "central" else ""
        stored = {prefix + name: value for name, value in values.items()}
        current = dict(box.prefs.limits)

        def setting(name: str) -> Any:
            if name in stored:
                return stored[name]
            if name in current:
                return current[name]
            return None if name.startswith(CENTRAL_TIER) else getattr(box.config, name, None)

        # the central tier is checked against the box tier it must stay under; a box that
        # lowers its own tier is never refused for what a central allotted (the least wins)
        central = (lambda n: setting(CENTRAL_TIER + n)) if prefix else box_limits.no_limit
        problems = box_limits.problems_on_this_box(
            setting, box.gpus.read(), box.catalog.roots, central
        )
        if problems:
            raise InvalidRequest(
                "Refused: " + "; ".join(problems) + ".",
                param=next(iter(values), None),
                code="above_parent_tier",
            )
        await box.update_settings("limits", "", stored)
        _record(request, "limits" if tier == "box" else "limits-central", None, values)
    found = box_limits.describe(
        box_limits.on_this_box(
            box.prefs.limit, box.gpus.read(), box.catalog.roots, box.prefs.central_limit
        )
    )
    return JSONResponse({"object": "list", "data": found})


async def cores(request: Request) -> Response:
    """GET /v1/cores: physical cores, which one fitbox keeps, which engine claims which."""
    box = _box(request)
    physical = box.physical_cores()
    claimable = set(box.claimable_cores())
    keep = reserved_core(claimable)
    busy = read_core_busy()
    other_work = set(box.snapshots.busy.busy())  # sustained readings (box/sensors.py)
    held: dict[int, str] = {}
    for resident in box.residents():
        for core in resident.cores:
            held[core] = resident.artifact.name
    rows = []
    for core, cpus in sorted(physical.items()):
        load = [busy[c] for c in cpus if c < len(busy)]
        if core in held:
            role = "claimed"  # the reserved one too, lent to an engine alone on the box
        elif core == keep:
            role = "fitbox and the OS"
        else:
            role = "free" if core in claimable else "outside cpu_max"
        rows.append(
            {
                "core": core,
                "cpus": sorted(cpus),
                "busy_percent": max(load, default=0.0),
                "role": role,
                "claimed_by": held.get(core),
                "lent": core == keep and core in held,
                "busy_with_other_work": core in other_work,
            }
        )
    return JSONResponse(
        {
            "object": "list",
            "data": rows,
            "physical": len(physical),
            "claimable": claimable_count(claimable),
        }
    )


async def verdicts(request: Request) -> Response:
    """GET /v1/verdicts?model=: every variant x rung x K/V type priced now, and the Auto pick
    (what a call would get). Without ``model``: every model on the box, the Auto pick only."""
    box = _box(request)
    model = request.query_params.get("model")
    names = [model] if model else [a.name for a in box.catalog.artifacts()]
    out = []
    for name in names:
        ask, artifacts = box.ask_for(name, all_kv=True)
        snapshot = box.snapshot()
        found, pick = price_all(snapshot, ask)
        label = {a.key: a.name for a in artifacts} | {
            r.key: r.artifact.name for r in box.residents()
        }
        entry: dict[str, Any] = {"model": name, "auto": report(pick, snapshot, label, {})}
        if model:
            entry["verdicts"] = [_verdict(v, label) for v in found]
        out.append(entry)
    return JSONResponse({"object": "list", "data": out})


def _verdict(v: Any, label: dict[str, str]) -> dict[str, Any]:
    return {
        "artifact": label.get(v.artifact, v.artifact),
        "rung": v.rung.value,
        "kv": f"{v.type_k}/{v.type_v}",
        "admissible": v.admissible,
        "waits": v.waits,
        "window": v.window or None,
        "band": None
        if v.band is None
        else {"kind": v.band.kind.value, "min": v.band.feasible_min, "max": v.band.feasible_max},
        "devices": {d: {"bytes": f.total, "text": format_bytes(f.total)} for d, f in v.footprint},
        "victims": [label.get(k, k) for k in v.victims],
        "cores": list(v.cores),
        "predicted_seconds": v.predicted_seconds,
        "reason": v.rejected.reason.value if v.rejected and not v.admissible else None,
        "detail": v.rejected.detail if v.rejected and not v.admissible else None,
    }


def _key_view(box: Box, key_id: str) -> dict[str, Any]:
    return {
        "key": key_id,
        "own": box.prefs.keys.get(key_id, {}),
        "effective": dict(box.prefs.for_key(key_id)),
    }


async def key_settings(request: Request) -> Response:
    """GET /v1/settings/key[?key=] and POST {"key": id, knob: value, ...}: what a call under
    that key sees (KEY_KNOBS: reasoning_field, progress); the box's where it sets none."""
    box = _box(request)
    if request.method == "POST":
        body = await _body(request)
        key_id = body.pop("key", None) if isinstance(body, dict) else None
        if not isinstance(key_id, str) or not key_id:
            raise InvalidRequest(
                "Field 'key' (a key id, as /v1/keys lists) is required.", param="key"
            )
        store: Store = request.app.state.store
        asked: str = key_id
        if await read(store.path, lambda conn: find_key(conn, asked), "find the key") is None:
            raise InvalidRequest(
                f"No key with id {key_id!r}; /v1/keys lists them.",
                param="key",
                code="key_not_found",
            )
        values = parse(KEY_KNOBS, body)
        await box.update_settings("key", key_id, values)
        _record(request, "settings-key", key_id, values)
        return JSONResponse(_key_view(box, key_id))
    key_id = request.query_params.get("key")
    if key_id:
        return JSONResponse(_key_view(box, key_id))
    return JSONResponse({"object": "list", "data": [_key_view(box, k) for k in box.prefs.keys]})
