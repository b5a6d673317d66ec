"""The Starlette application: builds the store, catalog and box, and wires the routes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import AsyncIterator

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect

import fitbox
from fitbox.box.box import Box
from fitbox.box.helper.answers import tool_block
from fitbox.box.helper.helper import Helper
from fitbox.config import Config
from fitbox.errors import FitboxError
from fitbox.home import Home
from fitbox.models.catalog import Catalog
from fitbox.probe.gpus import GpuReading, open_gpu_probe
from fitbox.server.door import cors, errors
from fitbox.server.door.auth import AuthMiddleware, Gate, TrustSettings
from fitbox.server.door.timing import ServerTimingMiddleware
from fitbox.server.manage import box_identity, joining, telemetry
from fitbox.server.routes import ACCESS, ROUTES, SESSION_ROUTES
from fitbox.server.views.leaving import Leaving
from fitbox.server.views.mcp_tools import McpDoor
from fitbox.server.views.metrics import Metrics
from fitbox.store.box_key import ensure_box_key
from fitbox.store.db import Store, StoreUnavailable
from fitbox.store.keys import KeyChecker

log = logging.getLogger(__name__)


def create_app(config: Config, store: Store | None = None, address: str | None = None) -> Starlette:
    """``store``: one `fitbox serve` opened before it listened (else the app opens it);
    ``address``: the URL it answers on (a serve knows its port once it has bound it)."""

    def lifespan(app: Starlette) -> contextlib.AbstractAsyncContextManager[None]:
        return _serving(app, config, store, address)

    return Starlette(
        routes=list(ROUTES),  # the route table's (server/routes.py)
        middleware=[
            Middleware(ServerTimingMiddleware),
            *cors.middleware(config.cors_origins),
            Middleware(AuthMiddleware),
        ],
        lifespan=lifespan,
        exception_handlers={
            FitboxError: errors.on_fitbox_error,
            HTTPException: errors.on_http_exception,
            StoreUnavailable: errors.on_store_unavailable,
            ClientDisconnect: errors.on_client_gone,
            Exception: errors.on_unexpected,
        },
    )


@contextlib.asynccontextmanager
async def _serving(
    app: Starlette, config: Config, opened: Store | None, address: str | None
) -> AsyncIterator[None]:
    """The store, catalog, box and gate of one serve, on ``app.state``; closed at its end."""
    store = opened or Store(config.store_path)
    catalog = Catalog(config.models, config.aliases, config.facts_cache, config.tf_support)
    gpus = open_gpu_probe(config.simulated_gpus)
    _log_gpus(gpus.read())
    box = Box(config, catalog, gpus, store)
    box.reap_orphans()
    app.state.changes = _change_signal(store)
    ensure_box_key(store, config.box_key_file)
    app.state.gate = Gate(
        TrustSettings(
            config.trusted_networks,
            config.trusted_proxies,
            config.host,
            config.host_names,
            allowed_origins=config.cors_origins,  # pages the operator let in, keyless too
        ),
        KeyChecker(config.store_path, config.box_key_file),
        config.require_keys,
        ACCESS,
        SESSION_ROUTES,
    )
    async with anyio.create_task_group():
        pass  # imports anyio's backend now, not inside the first streamed reply (~0.4 s)
    app.state.config, app.state.store, app.state.box = config, store, box
    app.state.metrics, app.state.mcp = Metrics(box, store), McpDoor()
    # fitbox-helper's menus over the box (box/helper/); its config menu answers with
    # ``fitbox config``'s own block (box/helper/answers.py tool_block)
    app.state.helper = Helper(box, blocks=tool_block)
    app.state.leaving = Leaving()  # told by `fitbox serve` when a stop signal comes
    app.state.started_at = time.time()  # /health's uptime
    app.state.identity = _identity(config, store, address)
    box.start()
    _log_models(catalog, config)
    joining = _join_central(config, app.state.identity)
    try:
        async with app.state.mcp.running():
            yield
    finally:
        # each step of a stop is logged with its time, so a stop that hangs says where
        began = time.monotonic()
        log.info("stopping: %d engine(s) to stop", len(box.registry))
        if joining is not None:
            joining.cancel()
        await box.close()
        log.info("stopping: engines stopped after %.2f s", time.monotonic() - began)
        app.state.gate.checker.close()
        store.close()
        log.info("stopped: the store closed after %.2f s", time.monotonic() - began)


def _identity(config: Config, store: Store, address: str | None) -> dict[str, str | None]:
    """What /health and a central know this box by: its persistent id (never its hostname),
    its name, version and the address it answers on."""
    port = config.port or 0
    where = address or f"http://{config.host}:{port}"
    if config.central_url and config.host in ("0.0.0.0", "::"):
        where = joining.reachable_address(
            config.host, int(where.rsplit(":", 1)[1]), config.central_url
        )
    return {
        "box_id": box_identity.checked_box_id(
            store, config.home, Home(config.home).identity, config.central_secret_file
        ),
        "name": socket.gethostname(),
        "version": fitbox.__version__,
        "address": where,
    }


def _join_central(config: Config, identity: dict[str, str | None]) -> asyncio.Task[None] | None:
    """Register with the central in the background: a start never waits on one."""
    if not config.central_url:
        return None
    box_id, name, address = identity["box_id"], identity["name"], identity["address"]
    if box_id is None or name is None or address is None:
        log.error("not registering with the central: the store holds no box id yet")
        return None
    try:
        box_key = config.box_key_file.read_text().strip()
    except OSError as exc:
        log.error("not registering with the central: the box key cannot be read (%s)", exc)
        return None
    registration = joining.Registration(
        config.central_url,
        config.central_key,
        box_id,
        name,
        address,
        box_key,
        config.central_secret_file,
        config.box_key_file,
    )
    return asyncio.get_running_loop().create_task(joining.keep_registering(registration))


def _change_signal(store: Store) -> telemetry.ChangeSignal:
    """A signal the telemetry readers wait on, fired after each store commit that moved the
    change counter (the commit happens on the store's writer thread, hence the hop)."""
    loop = asyncio.get_running_loop()
    changes = telemetry.ChangeSignal()

    def wake_readers(counter: int) -> None:
        loop.call_soon_threadsafe(changes.fire)

    store.on_change(wake_readers)
    return changes


def _log_gpus(gpus: list[GpuReading]) -> None:
    for gpu in gpus:
        label = " (SIMULATED)" if gpu.simulated else ""
        log.info("GPU %d: %s, %d MiB%s", gpu.index, gpu.name, gpu.total >> 20, label)


def _log_models(catalog: Catalog, config: Config) -> None:
    roots = ", ".join(map(str, config.models))
    if catalog.artifacts():
        log.info("%d models under %s", len(catalog.artifacts()), roots)
    else:
        log.warning("no models under %s yet: run 'fitbox pull' or add GGUF files", roots)
