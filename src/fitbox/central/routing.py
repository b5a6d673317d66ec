"""Calls through the central: which box takes a model, and the forwarding itself.

``box/model`` goes to that box (by id, or by a name only one box has). A bare name goes,
in this order, to the boxes where it is resident with a slot free (least busy first), then
where it fits without evicting a serving model (by the box's own ``/v1/plan``) and to the
resident ones whose slots are all taken, in the order their predicted waits say (a
"spill" when a load elsewhere is sooner than the wait for a slot: central/spill.py), then
where its file is.
A box that fails before the first byte of its answer (refused, reset, no reply) is retried
once on the next candidate and left out of bare-name routing until its mirror hears from
it again; after the first byte the box's answer, error or not, is the client's. Bytes pass
through as they come (SSE whole events at a time, so a stream its box cut off mid-way ends
with an error event and ``data: [DONE]``, not a broken one).

Only a box the mirror hears from takes new calls (``BoxLink.takes_calls``): not one that
is unreachable, still connecting, or suspected (its long-poll late). A model the central
knows of (from a box's last-known list, kept across a restart of the central) whose boxes
take no calls now is a 503 with ``Retry-After``, not a 404: a retry can help."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import httpx
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from fitbox.central import outsider, spill
from fitbox.central.box_link import relayed
from fitbox.central.mirror import BoxLink, Fleet
from fitbox.central.spill import Spill
from fitbox.engines.http1 import EngineConnectionError, EngineResponse
from fitbox.errors import (
    EngineFailed,
    FitboxError,
    InvalidRequest,
    ModelNotFound,
    PermissionDenied,
)
from fitbox.server.door.auth import is_insider
from fitbox.server.manage.joining import CENTRAL_KEY_HEADER, central_key_header

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "proxy-authenticate",
        "proxy-authorization",
    }
)
# uvicorn sends the central's own date and server: the box's would make two of each
DROPPED = HOP_BY_HOP | {"date", "server"}
PASSED = ("x-request-id",)  # the client's own id: the box records it on its call row
TRIES = 2  # the first candidate and, when it fails before its first byte, the next
PLAN_TIMEOUT_S = 30.0  # a plan prices, it loads nothing; a loaded box may be slow to
RETRY_AFTER_S = 5.0  # the mirror asks an unreachable box again at least this often
SSE = "text/event-stream"


class BoxesNotReady(FitboxError):
    """The boxes that have the model take no calls now (unreachable, not synced since the
    central started, or suspected): a retry once the mirror hears from one can succeed."""

    status = 503
    type = "server_error"
    code = "box_unavailable"
    retry = True


class NoBoxTook(EngineFailed):
    """Every box tried failed before its first byte: none took the call, so a retry is safe
    and may find one back (or another) up."""

    retry = True


class BoxLost(EngineFailed):
    """A box that stopped answering mid-stream (the error event a cut stream ends with)."""

    code = "box_lost"


@dataclass(frozen=True)
class Candidate:
    link: BoxLink
    model: str  # the name the box knows it by
    why: str  # named | resident | fits | spill | on_disk
    spill: Spill | None = None  # the waits compared, where a spill was weighed


def holding(link: BoxLink, model: str) -> dict[str, Any] | None:
    for entry in link.models:
        if entry.get("id") == model or model in (entry.get("aliases") or []):
            return entry
    return None


async def _placing(fleet: Fleet, link: BoxLink, model: str) -> dict[str, Any] | None:
    """The box's own plan, when it places the model without evicting a serving one."""
    try:
        response = await fleet.client.get(
            f"{link.record.url}/v1/plan",
            params={"model": model},
            headers=link.headers,
            timeout=PLAN_TIMEOUT_S,
        )
        plan = response.json()
    except (httpx.HTTPError, ValueError):
        return None
    if isinstance(plan, dict) and plan.get("decision") == "place" and not plan.get("victims"):
        return plan
    return None


async def plans_where(
    fleet: Fleet, links: list[BoxLink], model: str
) -> dict[str, dict[str, Any] | None]:
    """Each box's plan for the model where it places it without evicting; None elsewhere."""
    found = await asyncio.gather(*(_placing(fleet, link, model) for link in links))
    return {link.record.box_id: plan for link, plan in zip(links, found, strict=True)}


async def fits_where(fleet: Fleet, links: list[BoxLink], model: str) -> dict[str, bool]:
    plans = await plans_where(fleet, links, model)
    return {box_id: plan is not None for box_id, plan in plans.items()}


async def candidates(fleet: Fleet, model: str, enough: int = TRIES) -> list[Candidate]:
    """The boxes to try, best first. The boxes' plans (where it fits) are asked only when
    fewer than ``enough`` boxes hold it resident: a call to a resident model costs no
    request to any other box."""
    if "/" in model:
        box_name, _, rest = model.partition("/")
        link = fleet.find(box_name)
        if link is not None:
            if not link.takes_calls():
                raise _not_ready(model, [link])
            return [Candidate(link, rest, "named")]
    holders = [link for link in fleet.links.values() if holding(link, model) is not None]
    drained = [link.record.box_id for link in holders if link.record.draining]
    holders = [link for link in holders if not link.record.draining]
    if drained and not holders:
        raise ModelNotFound(
            f"The model '{model}' is only on draining boxes ({', '.join(drained)}): "
            "name one as BOX/MODEL, or undrain it (fitbox central boxes undrain BOX).",
            param="model",
        )
    if not holders:
        names = sorted({e["id"] for link in fleet.links.values() for e in link.models})
        raise ModelNotFound(
            f"No box of this fleet has the model '{model}'; GET /v1/models "
            f"lists what they have ({', '.join(names[:20]) or 'nothing yet'}). "
            "Name one box's as BOX/MODEL.",
            param="model",
        )
    ready = [link for link in holders if link.takes_calls()]
    if not ready:
        raise _not_ready(model, holders)
    usable = [link for link in ready if not link.refused_calls] or ready
    resident = sorted(
        (link for link in usable if (holding(link, model) or {}).get("resident")), key=_order
    )
    free = [link for link in resident if not _slots_full(link, model)]
    found = [Candidate(link, model, "resident") for link in free]
    if len(found) >= enough:
        return found
    # fewer free than wanted: where it fits without evicting a serving model, and the
    # residents whose slots are all taken, in the order their predicted waits say (a spill
    # when loading there is sooner than queueing here: central/spill.py)
    full = [link for link in resident if link not in free]
    others = sorted((link for link in usable if link not in resident), key=_order)
    plans = await plans_where(fleet, others, model)
    fits = [link for link in others if plans[link.record.box_id] is not None]
    found += _placed_or_queued(model, full, [(k, plans[k.record.box_id] or {}) for k in fits])
    found += [Candidate(link, model, "on_disk") for link in others if link not in fits]
    return found


def _placed_or_queued(
    model: str, full: list[BoxLink], fits: list[tuple[BoxLink, dict[str, Any]]]
) -> list[Candidate]:
    """The boxes that place the model and the residents with every slot taken, in the order
    to try: the placing ones first when the call spills (or when none is full), else the
    busy ones (the wait for their slot is shorter than a load elsewhere)."""
    if not full or not fits:
        return [Candidate(link, model, "fits") for link, _ in fits] + [
            Candidate(link, model, "resident") for link in full
        ]
    named = [(link, (holding(link, model) or {}).get("id", model)) for link in full]
    weighed, order = spill.decide(named, [(link, model, plan) for link, plan in fits])
    placing = [Candidate(link, model, "spill", weighed) for link in order]
    queued = [
        Candidate(link, model, "resident", weighed)
        for link in sorted(full, key=lambda link: link.record.box_id != weighed.busy)
    ]
    return placing + queued if weighed.taken else queued + placing


def _order(link: BoxLink) -> tuple[int, str]:
    return link.busy(), link.record.box_id


def _slots_full(link: BoxLink, model: str) -> bool:
    """Every slot of the model's resident on the box is taken, as far as the central knows:
    its own calls in flight there (on any model of the box: it counts per box) and the
    box's queue, against the resident's ``parallel``. A new call would wait there."""
    name = (holding(link, model) or {}).get("id", model)
    slots = [int(r.get("parallel") or 1) for r in link.residents if r.get("model") == name]
    return bool(slots) and link.busy() >= max(slots)


def _not_ready(model: str, links: list[BoxLink]) -> BoxesNotReady:
    states = ", ".join(f"{link.record.box_id} ({link.shown_state()})" for link in links)
    return BoxesNotReady(
        f"The model '{model}' is on boxes that take no calls now: {states}. Retry in a few "
        "seconds; GET /v1/fleet shows each box's state.",
        param="model",
        retry_after=RETRY_AFTER_S,
    )


def allowed_models(request: Request) -> tuple[str, ...] | None:
    """The models the caller's central key is limited to; None when any may be asked for."""
    key = getattr(request.state, "api_key", None)
    models: tuple[str, ...] | None = key.models if key is not None else None
    return models


def bare_name(fleet: Fleet, model: str) -> str:
    """The model's name without a BOX/ in front (a box's id or a name only it has)."""
    box_name, _, rest = model.partition("/")
    return rest if rest and fleet.find(box_name) is not None else model


def check_allowed(fleet: Fleet, allowed: tuple[str, ...] | None, model: str) -> None:
    """A key limited to some models (keys create --model) asks for those only, on any box:
    the limit names models, not boxes."""
    if allowed is None or model in allowed or bare_name(fleet, model) in allowed:
        return
    raise PermissionDenied(
        f"This key may not use the model '{model}' (it may use: {', '.join(allowed)}).",
        param="model",
        code="model_not_allowed",
    )


def _passed_headers(
    response: EngineResponse, candidate: Candidate, tried: list[str], started: float
) -> dict[str, str]:
    headers = {k: v for k, v in response.headers.items() if k not in DROPPED}
    box_id = candidate.link.record.box_id
    timing = f'box;desc="{box_id}";dur={(time.perf_counter() - started) * 1000:.1f}'
    headers["server-timing"] = ", ".join(filter(None, [headers.get("server-timing"), timing]))
    headers["x-fitbox-box"] = box_id
    headers["x-fitbox-route"] = candidate.why
    if candidate.spill is not None:  # the predicted waits the route was chosen by
        headers[spill.HEADER] = candidate.spill.header()
    if tried:
        headers["x-fitbox-retried-from"] = ", ".join(tried)
    return headers


def _key_said(request: Request) -> dict[str, str]:
    """Which central key made the call, for the box's call row (its id and name, never its
    secret). The box believes it only on a request made with its own key, which it handed
    this central alone (server/manage/joining.py central_key_of): a client's own header of
    that name is not passed on, and one sent to a box directly is ignored there."""
    key = getattr(request.state, "api_key", None)
    if key is None:  # admitted without a key (the central's own host): none to name
        return {}
    return {CENTRAL_KEY_HEADER: central_key_header(key.key_id, key.name)}


@dataclass(frozen=True)
class Asked:
    """A call as the client made it: where its model was named (the body's ``model``, else
    the ``model`` query parameter, as the box reads it; or the path: /v1/models/{id})."""

    method: str
    path: str
    model: str
    raw: bytes
    body: dict[str, Any] | None  # None: the model is not in the body
    query: list[tuple[str, str]]

    def for_box(self, model: str) -> tuple[str, bytes]:
        """The target and body for the box that knows the model as ``model``."""
        path = self.path.replace("{model_id:path}", quote(model, safe="/"))
        content = self.raw
        if self.body is not None and model != self.model:
            content = json.dumps({**self.body, "model": model}).encode()
        query = [(k, model if k == "model" and self.body is None else v) for k, v in self.query]
        return (f"{path}?{urlencode(query)}" if query else path), content


async def asked(request: Request, path: str) -> Asked:
    query = list(request.query_params.multi_items())
    model: object = request.query_params.get("model")
    body: dict[str, Any] | None = None
    raw = b""
    if "{model_id:path}" in path:
        model = request.path_params["model_id"]
    elif request.method == "POST":
        raw = await request.body()
        try:
            found = json.loads(raw)
        except ValueError:
            raise InvalidRequest("The body is not JSON.") from None
        if isinstance(found, dict) and "model" in found:
            model, body = found.get("model"), found
    if not isinstance(model, str) or not model:
        raise InvalidRequest(
            "The call needs 'model' (in its body, or ?model= where the body names none): a "
            "model name or BOX/MODEL.",
            param="model",
        )
    return Asked(request.method, path, model, raw, body, query)


async def forward(request: Request, fleet: Fleet, path: str) -> Response:
    """``path`` (a box's inference route) to the box that takes its model."""
    if path in outsider.INSIDER_ONLY and not is_insider(request):
        raise PermissionDenied(
            f"{path} shows every caller's prompts on the box: through the central it needs a "
            "central admin key, or a call from the central's own host.",
            code="insider_only",
        )
    call = await asked(request, path)
    model = call.model
    check_allowed(fleet, allowed_models(request), model)
    found = await candidates(fleet, model, enough=1)
    tried: list[str] = []
    started = time.perf_counter()
    for attempt in range(TRIES):
        if attempt == len(found) == 1 and found[0].why != "named":  # the first failed
            found += [c for c in await candidates(fleet, model) if c.link is not found[0].link]
        if attempt >= len(found):
            break
        candidate = found[attempt]
        link = candidate.link
        target, content = call.for_box(candidate.model)
        headers = {**link.headers, "accept": request.headers.get("accept", "*/*")}
        headers |= {k: request.headers[k] for k in PASSED if k in request.headers}
        headers |= _key_said(request)
        if call.method == "POST":
            headers["content-type"] = "application/json"
        link.call_started()
        try:
            response = await link.http.send(call.method, target, content, headers)
        except (EngineConnectionError, TimeoutError) as exc:  # before the first byte
            link.call_ended()
            link.refused_calls = True
            tried.append(f"{link.record.box_id} ({exc or type(exc).__name__})")
            continue
        except BaseException:  # the client went away while the box was asked
            link.call_ended()
            raise
        passed = _passed_headers(response, candidate, tried, started)
        if is_insider(request) or not outsider.rewritten(path, response.status):
            return StreamingResponse(
                _relay(response, link), status_code=response.status, headers=passed
            )
        return await _as_outsider(response, link, path, passed)
    raise NoBoxTook(
        f"No box could take the call for '{model}': tried {', '.join(tried)}; "
        "GET /v1/fleet shows each box's state.",
        param="model",
        retry_after=RETRY_AFTER_S,
    )


async def _as_outsider(
    response: EngineResponse, link: BoxLink, path: str, headers: dict[str, str]
) -> Response:
    """A box's answer a whole body at a time (an error, /props: small), as the central's
    outsider may see it (central/outsider.py)."""
    raw = b"".join([piece async for piece in _relay(response, link)])
    headers.pop("content-length", None)
    body = outsider.props_body(raw) if response.status < 400 else outsider.error_body(raw)
    return Response(body, status_code=response.status, headers=headers)


async def _relay(response: EngineResponse, link: BoxLink) -> AsyncIterator[bytes]:
    """The box's body as it comes; an event stream whole events at a time, so that one the
    box cut off ends with an error event and ``data: [DONE]`` (a stream's status line is
    long gone: this is the only way left to tell the client)."""
    sse = response.headers.get("content-type", "").startswith(SSE)
    held = b""  # an event stream's bytes after its last whole event
    try:
        async for chunk in relayed(response):
            if not sse:
                yield chunk
                continue
            held += chunk
            end = held.rfind(b"\n\n") + 2
            if end > 1:
                yield held[:end]
                held = held[end:]
        if held:
            yield held
    except (EngineConnectionError, TimeoutError) as exc:
        if not sse:
            raise
        link.refused_calls = True  # until its mirror hears from it again
        yield _cut_off(link, exc)
    finally:
        link.call_ended()
        response.close()


def _cut_off(link: BoxLink, exc: BaseException) -> bytes:
    lost = BoxLost(
        f"The box {link.record.box_id} stopped answering mid-stream "
        f"({exc or type(exc).__name__}): the reply above is incomplete. "
        "GET /v1/fleet shows each box's state.",
    )
    return b"data: " + json.dumps(lost.body()).encode() + b"\n\ndata: [DONE]\n\n"


def model_list(fleet: Fleet, allowed: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Every model of the fleet once by its bare name, and once per box as BOX/MODEL (those
    a limited key may use)."""
    bare: dict[str, dict[str, Any]] = {}
    per_box: list[dict[str, Any]] = []
    for link in fleet.links.values():
        for entry in link.models:
            name = entry["id"]
            if allowed is not None and name not in allowed:
                continue
            one = bare.setdefault(
                name,
                {
                    "id": name,
                    "object": "model",
                    "owned_by": "fitbox",
                    "created": entry.get("created", 0),
                    "boxes": [],
                    "resident_on": [],
                },
            )
            one["boxes"].append(link.record.box_id)
            if entry.get("resident"):
                one["resident_on"].append(link.record.box_id)
            per_box.append(
                {**entry, "id": f"{link.record.box_id}/{name}", "box_id": link.record.box_id}
            )
    return {"object": "list", "data": [*bare.values(), *per_box]}
