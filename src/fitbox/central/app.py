"""The central's Starlette application: registration, the fleet view, the mirrored tables,
and the OpenAI routes forwarded to the boxes. Keys and trust as on a box (server/door/auth.py),
plus one rule: a worker key may register a box and do nothing else."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

import fitbox
from fitbox.central import boxes, fresh, identity, metrics, openapi, page, routing
from fitbox.central.backend import StoreTarget, StoreUnavailable
from fitbox.central.facts import FactOffers
from fitbox.central.identity import BoxIdentityRefused, BoxIdInUse
from fitbox.central.mirror import MIRRORED_TABLES, Fleet
from fitbox.central.store import CentralStore
from fitbox.config import Config
from fitbox.errors import AuthenticationFailed, FitboxError, InvalidRequest, PermissionDenied
from fitbox.server.door import errors
from fitbox.server.door.auth import (
    Gate,
    TrustSettings,
    admit,
    insider,
    origin_of,
    presented_key,
)
from fitbox.server.door.browser import names_box
from fitbox.server.door.errors import INSIDER
from fitbox.server.manage.joining import is_loopback
from fitbox.server.routes import ACCESS
from fitbox.server.views.leaving import Leaving
from fitbox.store.keys import ApiKey

log = logging.getLogger(__name__)
REGISTER = "/v1/boxes"
REJECTS = "mirror_rejects"
MAX_ROWS = 1000
HEALTH_STORE_S = 3.0  # /health answers within this even while the store hangs


def admit_central(
    path: str, method: str, peer: str | None, headers: dict[str, str], gate: Gate
) -> ApiKey | None:
    """Registration: a worker or admin key, or no key from the central's own host. Every
    other route: the box's rules (a worker key has none of their scopes). The key the call
    runs under (None when trust alone admits it)."""
    if path == REGISTER and method == "POST":
        presented = presented_key(headers)
        key = gate.checker.verify(presented, time.time()) if presented else None
        if presented and key is None:
            raise AuthenticationFailed("The key is not valid: unknown, revoked or expired.")
        if key is not None:
            if not {"worker", "admin"} & set(key.scopes):
                raise PermissionDenied(
                    "Registering a box needs a worker (or admin) key: "
                    "'fitbox central keys create --scope worker'."
                )
            return key
        if origin_of(peer, headers, gate.settings).local:
            return None
        raise AuthenticationFailed(
            "Registering a box needs the worker key the central "
            "printed: fitbox serve --central URL --central-key KEY.",
            code="missing_api_key",
        )
    return admit(path, peer, headers, gate, method)


class CentralAuth:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gate: Gate | None = getattr(scope["app"].state, "gate", None)
        if scope["type"] == "http" and gate is not None:
            headers = {
                k.decode("latin-1").lower(): v.decode("latin-1")
                for k, v in scope.get("headers", [])
            }
            client = scope.get("client")
            door = functools.partial(
                admit_central,
                scope["path"],
                scope["method"],
                client[0] if client else None,
                headers,
                gate,
            )
            try:
                if presented_key(headers):
                    # a key is read from the store: on PostgreSQL a round trip or a wait on a
                    # lock, never on the loop every other call shares. anyio's threads, not the
                    # loop's executor the store's reads and writes go through
                    key = await anyio.to_thread.run_sync(door)
                else:
                    key = door()  # trust alone decides: nothing read
            except FitboxError as exc:
                await errors.error_response(exc)(scope, receive, send)
                return
            state = scope.setdefault("state", {})
            state["api_key"] = key  # its model limits (routing.py)
            # who may see a box's paths and engine internals (central/outsider.py)
            origin = origin_of(client[0] if client else None, headers, gate.settings)
            state[INSIDER] = insider(key, origin, names_box(headers, gate.settings))
        await self.app(scope, receive, send)


def _fleet(request: Request) -> Fleet:
    fleet: Fleet = request.app.state.fleet
    return fleet


async def health(request: Request) -> Response:
    """Liveness, and what is wrong (status degraded, the problems named): a store that
    cannot be read refuses every keyed call (503 store_unavailable)."""
    fleet = _fleet(request)
    states = [link.shown_state() for link in fleet.links.values()]  # a late poll: suspected
    store_state, problems = await _store_state(request.app.state.store)
    return JSONResponse(
        {
            "status": "degraded" if problems else "ok",
            "problems": problems,
            "service": "fitbox-central",
            "version": fitbox.__version__,
            "store": store_state,
            "boxes": len(states),
            "boxes_up": states.count("up"),
        }
    )


async def _store_state(store: CentralStore) -> tuple[str, list[str]]:
    """``up`` or ``down``, and why it is down."""
    try:
        async with asyncio.timeout(HEALTH_STORE_S):  # not wait_for: it can lose a cancel
            await asyncio.to_thread(store.check)
    except StoreUnavailable as exc:
        return "down", [f"{exc.message}; keyed calls are refused (503) until it answers"]
    except TimeoutError:
        return "down", [
            f"the central's store {store.where} did not answer within {HEALTH_STORE_S:g} s; "
            "keyed calls wait on it"
        ]
    return "up", []


async def register(request: Request) -> Response:
    """POST /v1/boxes {box_id, name, version, url, admin_key, box_secret?}: add a box, or
    update (move) one that proves it is that box (central/identity.py)."""
    try:
        body = await request.json()
    except ValueError:
        raise InvalidRequest("The body is not JSON.") from None
    fields = ("box_id", "name", "version", "url", "admin_key")
    for name in fields:
        if not isinstance(body, dict) or not isinstance(body.get(name), str) or not body[name]:
            raise InvalidRequest(f"The registration needs '{name}' (text).", param=name)
    proof = body.get("box_secret")
    if proof is not None and not isinstance(proof, str):
        raise InvalidRequest("'box_secret' is text when given.", param="box_secret")
    url = _box_url(body["url"], request.app.state.config)
    store: CentralStore = request.app.state.store
    fleet = _fleet(request)
    link = fleet.links.get(body["box_id"])
    try:
        on_record = link.record if link is not None else None
        if on_record and on_record.url != url and identity.proven(proof, on_record.secret_hash):
            # proven, from elsewhere: a move, or a twin with the same secret
            await identity.refuse_a_live_twin(fleet.client, body["box_id"], on_record.url, url)
        taken = await asyncio.to_thread(
            store.register,
            body["box_id"],
            body["name"],
            body["version"],
            url,
            body["admin_key"],
            proof,
        )
    except (BoxIdentityRefused, BoxIdInUse) as exc:
        _refused_once(request, body["box_id"], url, exc)
        raise
    record = next(r for r in await asyncio.to_thread(store.boxes) if r.box_id == body["box_id"])
    if taken.moved or body["box_id"] not in fleet.links:
        fleet.follow(record)
    else:
        fleet.links[record.box_id].record = record  # a new key, name or version
    log.info("box %s (%s) registered at %s", record.box_id, record.name, url)
    answer: dict[str, Any] = {"box_id": record.box_id, "registered": True, "moved": taken.moved}
    if taken.secret is not None:
        answer["box_secret"] = taken.secret  # the one time it is told
    return JSONResponse(answer, status_code=201 if taken.moved else 200)


def _box_url(given: str, config: Config) -> str:
    url = given.rstrip("/")
    host = urlsplit(url).hostname or ""
    if not url.startswith(("http://", "https://")) or not host:
        raise InvalidRequest(f"'url' must be http://HOST:PORT; got {url!r}.", param="url")
    if is_loopback(host) and not is_loopback(config.host):
        raise InvalidRequest(
            f"The box's address {url} is loopback: this central (on {config.host}) could "
            "never reach it. Start the box with --host 0.0.0.0 or an address the central "
            "can reach.",
            param="url",
            code="box_unreachable",
        )
    return url


def _refused_once(request: Request, box_id: str, url: str, exc: FitboxError) -> None:
    """Log a refused registration once per (box id, address): a refused box asks again
    every minute, and one line says it all."""
    refused: set[tuple[str, str]] = request.app.state.refused_registrations
    if (box_id, url) not in refused:
        refused.add((box_id, url))
        log.warning("registration refused: %s", exc)


async def fleet_view(request: Request) -> Response:
    """Every box as the central knows it now: idle times, slots and memory worked out from
    the mirrored rows as this is read, each reading with its age (central/fresh.py)."""
    fleet = _fleet(request)
    links = list(fleet.links.values())
    rows = await asyncio.to_thread(fresh.recent_rows, fleet.store, [k.record.box_id for k in links])
    now = time.time()
    data = [fresh.box_now(link, rows[link.record.box_id], now) for link in links]
    return JSONResponse({"object": "list", "data": data})


async def fleet_models(request: Request) -> Response:
    """Every model on any box: resident where, on disk where, fits where (the boxes' plans)."""
    fleet = _fleet(request)
    names = sorted({e["id"] for link in fleet.links.values() for e in link.models})
    data = []
    for name in names:
        holders = [link for link in fleet.links.values() if routing.holding(link, name)]
        fits = await routing.fits_where(fleet, holders, name)
        data.append(
            {
                "id": name,
                # sorted by box id: the same answer whichever box registered first
                "resident_on": sorted(
                    h.record.box_id
                    for h in holders
                    if (routing.holding(h, name) or {}).get("resident")
                ),
                "on_disk_on": sorted(h.record.box_id for h in holders),
                "fits_on": sorted(box_id for box_id, ok in fits.items() if ok),
            }
        )
    return JSONResponse({"object": "list", "data": data})


async def tables(request: Request) -> Response:
    store: CentralStore = request.app.state.store
    known = await asyncio.to_thread(store.table_columns)
    data = [
        {"name": t, "kind": "table", "columns": known.get(t, ["box_id"]), "withheld": []}
        for t in MIRRORED_TABLES
    ]
    data.append(
        {
            "name": REJECTS,
            "kind": "table",
            "withheld": [],
            "columns": ["box_id", "tbl", "source_id", "raw", "reason", "at"],
        }
    )
    return JSONResponse({"object": "list", "data": data})


def _int(request: Request, name: str, default: int, high: int) -> int:
    raw = request.query_params.get(name) or str(default)
    try:
        value = int(raw)
    except ValueError:
        raise InvalidRequest(
            f"Query parameter '{name}' must be a whole number.", param=name
        ) from None
    if not 0 <= value <= high:
        raise InvalidRequest(f"Query parameter '{name}' must be within 0..{high}.", param=name)
    return value


async def table_rows(request: Request) -> Response:
    """GET /v1/telemetry/rows?table=T[&box_id=B&limit=L&offset=N&desc=true]: mirrored rows,
    each with its box_id (the box's own shape)."""
    store: CentralStore = request.app.state.store
    table = request.query_params.get("table", "")
    limit, offset = _int(request, "limit", 100, MAX_ROWS), _int(request, "offset", 0, 2**62)
    if table == REJECTS:
        rows: list[dict[str, Any]] = await asyncio.to_thread(store.rejects, limit, offset)
        return JSONResponse({"table": table, "rows": rows})
    if table not in MIRRORED_TABLES:
        raise InvalidRequest(
            f"No mirrored table {table!r}; GET /v1/telemetry/tables lists them.", param="table"
        )
    desc = request.query_params.get("desc", "").lower() in ("1", "true", "yes")
    rows = await asyncio.to_thread(
        store.mirrored, table, request.query_params.get("box_id"), limit, offset, desc
    )
    return JSONResponse({"table": table, "rows": rows})


async def models(request: Request) -> Response:
    return JSONResponse(routing.model_list(_fleet(request), routing.allowed_models(request)))


def _forwarded(path: str) -> Any:
    async def route(request: Request) -> Response:
        return await routing.forward(request, _fleet(request), path)

    return route


FORWARDED_ROUTES = tuple(
    Route(e.path, _forwarded(e.path), methods=e.methods) for e in openapi.FORWARDED
)


ROUTES = (
    Route("/health", health, methods=["GET"]),
    Route("/openapi.json", openapi.document, methods=["GET"]),
    Route("/", page.fleet_page, methods=["GET"]),
    Route("/dashboard/events", page.events, methods=["GET"]),
    Route("/metrics", metrics.scrape, methods=["GET"]),
    Route(REGISTER, register, methods=["POST"]),
    Route("/v1/fleet", fleet_view, methods=["GET"]),
    Route("/v1/fleet/models", fleet_models, methods=["GET"]),
    Route("/v1/fleet/boxes/{box_id}", boxes.change, methods=["PATCH"]),
    Route("/v1/fleet/boxes/{box_id}", boxes.remove, methods=["DELETE"]),
    Route("/v1/fleet/boxes/{box_id}/limits", boxes.limits, methods=["GET", "POST"]),
    Route("/v1/telemetry/tables", tables, methods=["GET"]),
    Route("/v1/telemetry/rows", table_rows, methods=["GET"]),
    Route("/v1/models", models, methods=["GET"]),
    *FORWARDED_ROUTES,
)


def create_central_app(config: Config, store_path: StoreTarget) -> Starlette:
    def lifespan(app: Starlette) -> contextlib.AbstractAsyncContextManager[None]:
        return _serving(app, config, store_path)

    return Starlette(
        routes=list(ROUTES),
        middleware=[Middleware(CentralAuth)],
        lifespan=lifespan,
        exception_handlers={
            FitboxError: errors.on_fitbox_error,
            HTTPException: errors.on_http_exception,
            Exception: errors.on_unexpected,
        },
    )


@contextlib.asynccontextmanager
async def _serving(app: Starlette, config: Config, store_path: StoreTarget) -> AsyncIterator[None]:
    store = CentralStore(store_path)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    timeout = httpx.Timeout(connect=5.0, read=600.0, write=60.0, pool=60.0)
    client = httpx.AsyncClient(limits=limits, timeout=timeout)  # management (central/box_link.py:
    # the mirror's requests and the forwarded calls)
    fleet = Fleet(store, client, config.central_long_poll)
    offers = FactOffers(fleet)
    app.state.config, app.state.store, app.state.fleet = config, store, fleet
    app.state.refused_registrations = set()
    app.state.leaving = Leaving()  # told by `fitbox central serve` when a stop signal comes
    app.state.gate = Gate(
        TrustSettings(
            config.trusted_networks, config.trusted_proxies, config.host, config.host_names
        ),
        store.key_checker(),
        config.require_keys,
        ACCESS,  # the central's paths meet the box's classes (its own /v1/fleet*: management)
    )
    fleet.start()
    try:
        yield
    finally:
        await fleet.close()
        await offers.close()
        await client.aclose()
        app.state.gate.checker.close()
        store.close()
