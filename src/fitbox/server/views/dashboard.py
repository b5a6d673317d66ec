"""GET / : the live dashboard (management: the box itself or an admin key, server/door/auth.py),
and GET /dashboard/events: its updates over SSE.

The page is rendered whole by the server (server/views/dashboard_html.py) and is the same with
JavaScript off. With it, the page listens on /dashboard/events, which sends the re-rendered
``<main>`` each time the store's change counter moves (``app.state.changes``) or a resident
changes state (the registry's change signal: a load finishing writes no row), and, while a
resident is loading, once per ``SPACING_S`` (the bytes of its weights read so far). Nothing
is sent otherwise: no polling, no heartbeat. A change is rendered once the counter has been
still for ``QUIET_S`` (after the reply of the call that moved it), at most ``SPACING_S`` late.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response, StreamingResponse

from fitbox.box.box import Box
from fitbox.core.types import ResidentState
from fitbox.errors import StoreBusy
from fitbox.server.inference.progress import loaded_bytes
from fitbox.server.manage.telemetry import ChangeSignal
from fitbox.store.db import Store
from fitbox.store.waits import bounded

from . import dashboard_html
from .dashboard_html import DeviceView, View
from .tally import REFUSALS, reader

ROWS = 20  # calls, evictions and refusals shown
# the least time between two updates to one page: a busy box moves the counter twice per
# call, and rendering the page each time would cost every call (bench/operator_overhead.py)
SPACING_S = 1.0
# how long the counter must stay still before a page is rendered: a call moves it as it
# starts (its row opens) and after its reply went (its row ends), so a render waits for the
# end instead of running on the loop while the call it saw is being forwarded
QUIET_S = 0.05


def _rows(store: Store) -> tuple[list[dict[str, Any]], ...]:
    codes = tuple(REFUSALS)
    marks = ", ".join("?" * len(codes))
    with contextlib.closing(reader(store.path)) as conn:

        def select(sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
            try:
                return [dict(r) for r in conn.execute(sql, (*params, ROWS))]
            except sqlite3.Error:
                return []  # a store that cannot be read shows empty tables, not an error

        calls = select("SELECT * FROM call_log ORDER BY id DESC LIMIT ?")
        evictions = select("SELECT * FROM evictions ORDER BY id DESC LIMIT ?")
        refusals = select(
            "SELECT * FROM call_log WHERE outcome = 'error' AND error_code IN "  # noqa: S608 - placeholders only
            f"({marks}) ORDER BY id DESC LIMIT ?",
            codes,
        )
    for row in refusals:
        row["reason"] = REFUSALS.get(row.get("error_code") or "", "")
    return calls, evictions, refusals


async def gather(box: Box, store: Store) -> View:
    counter = store.counter  # read first: a change after it is sent again, never missed
    calls, evictions, refusals = await bounded(
        lambda: _rows(store), store.path, "read the recent calls for the dashboard"
    )
    described = []
    for resident in box.residents():
        row = resident.describe()
        row["load_started_at"] = resident.load_started_at
        if resident.state is ResidentState.STARTING:
            with contextlib.suppress(OSError):  # a file gone meanwhile: seconds only
                row["bytes_loaded"], row["bytes_total"] = loaded_bytes(resident)
        described.append(row)
    devices = []
    for device in box.snapshot().devices:
        holders = [
            (r.artifact.name, r.state.value, size)
            for r in box.residents()
            for where, size in r.holdings().items()
            if where == device.id
        ]
        devices.append(
            DeviceView(device.id, device.kind.value, device.capacity, device.simulated, holders)
        )
    queued = box.queue()
    return View(
        counter,
        devices,
        described,
        queued,
        calls,
        evictions,
        refusals,
        problems=store.problems() + box.problems(),
    )


async def dashboard(request: Request) -> Response:
    view = await gather(request.app.state.box, request.app.state.store)
    return HTMLResponse(dashboard_html.page(view), headers={"cache-control": "no-store"})


def _event(view: View) -> bytes:
    lines = dashboard_html.main(view).splitlines() or [""]
    data = "".join(f"data: {line}\n" for line in lines)
    return f"event: update\nid: {view.counter}\n{data}\n".encode()


async def _changed(
    signal: ChangeSignal, registry: asyncio.Event, store: Store, shown: int, leaving: asyncio.Event
) -> None:
    """Until the store's counter moves past ``shown``, the registry changes (``registry``:
    its change event, taken before the state shown was read), or the server is stopping."""
    waits = [
        asyncio.ensure_future(signal.wait(3600.0)),
        asyncio.ensure_future(registry.wait()),
        asyncio.ensure_future(leaving.wait()),
    ]
    try:
        await asyncio.sleep(0)  # both waits now hold their events: a later fire wakes them
        if store.counter != shown:
            return  # it fired before they did
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


async def _settled(signal: ChangeSignal, store: Store, leaving: asyncio.Event) -> None:
    """Until the store's counter has stayed still for ``QUIET_S``, at most ``SPACING_S`` (a box
    busy with back-to-back calls is never still: its page is rendered at that bound)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SPACING_S
    while not leaving.is_set():
        seen, left = store.counter, deadline - loop.time()
        if left <= 0:
            return
        await signal.wait(min(QUIET_S, left), leaving)
        if store.counter == seen:
            return


async def events(request: Request) -> Response:
    """GET /dashboard/events?since=COUNTER: an update at once if the counter has moved past
    ``since`` (the page was rendered before it), then one per change."""
    box: Box = request.app.state.box
    store: Store = request.app.state.store
    signal: ChangeSignal = request.app.state.changes
    leaving: asyncio.Event = request.app.state.leaving.event
    raw = request.query_params.get("since", "")
    since = int(raw) if raw.isdigit() else -1

    async def stream() -> AsyncIterator[bytes]:
        shown, states = since, _states(box)
        while not leaving.is_set():  # a stopping server ends the stream: the page reconnects
            registry = box.registry.change()
            if store.counter != shown or _states(box) != states or _loading(box):
                await _settled(signal, store, leaving)
                states = _states(box)
                try:
                    view = await gather(box, store)
                except StoreBusy:  # the page keeps what it shows; tried after the spacing
                    view = None
                if view is not None:
                    shown = view.counter
                    yield _event(view)
                # changes meanwhile are gathered together, once the spacing has passed
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(SPACING_S):  # not wait_for: it can lose a cancel
                        await leaving.wait()
                continue
            await _changed(signal, registry, store, shown, leaving)

    return StreamingResponse(
        stream(), media_type="text/event-stream", headers={"cache-control": "no-store"}
    )


def _loading(box: Box) -> bool:
    """A resident is loading: its progress (bytes read) is news each spacing."""
    return any(r.state is ResidentState.STARTING for r in box.residents())


def _states(box: Box) -> tuple[tuple[str, ResidentState], ...]:
    return tuple((r.key, r.state) for r in box.residents())
