"""GET / : the live dashboard (a view: the box itself, a read or admin key, or a browser
signed in with one at /login, server/door/auth.py and sessions.py), and GET
/dashboard/events: its updates over SSE. An admin's page also has the action buttons and the
residents' engine log lines; a read key's only looks.

The page is rendered whole by the server (server/views/dashboard_html.py) and is the same with
JavaScript off. With it, the page listens on /dashboard/events, which sends the re-rendered
``<main>`` each time the store's change counter moves (``app.state.changes``) or a resident
changes state (the registry's change signal: a load finishing writes no row), and, while a
resident is loading, once per ``SPACING_S`` (the bytes of its weights read so far). Nothing
is sent otherwise but a ``beat`` event each ``BEAT_S`` (a few bytes, no rendering): the page
shows "disconnected" when it hears none (a stopped or hung box, a cut network); a signed-in
browser's stream ends at the beat after its key was revoked or it signed out. A change is
rendered once the counter has been still for ``QUIET_S`` (after the reply of the call that
moved it), at most ``SPACING_S`` late. The catalog's plans are priced at most once per
``PLAN_EVERY_S`` and again whenever the residents change.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sqlite3
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response, StreamingResponse

import fitbox
from fitbox.box import planning
from fitbox.box.box import Box
from fitbox.core.types import ResidentState
from fitbox.errors import FitboxError, StoreBusy
from fitbox.server.door.auth import session_of
from fitbox.server.inference.progress import loaded_bytes
from fitbox.server.manage.telemetry import ChangeSignal
from fitbox.store.db import Store
from fitbox.store.waits import bounded

from . import dashboard_html
from .dashboard_html import BEAT_S, DeviceView, View
from .tally import REFUSALS, reader

ROWS = 20  # calls, evictions and refusals shown
# the least time between two updates to one page: a busy box moves the counter twice per
# call, and rendering the page each time would cost every call (bench/operator_overhead.py)
SPACING_S = 1.0
# how long the counter must stay still before a page is rendered: a call moves it as it
# starts (its row opens) and after its reply went (its row ends), so a render waits for the
# end instead of running on the loop while the call it saw is being forwarded
QUIET_S = 0.05
PLAN_EVERY_S = 10.0  # the catalog's plans, priced again at most this often unless residents move
LOG_LINES = 8  # a resident's newest engine log lines shown


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


def _plans(box: Box) -> list[dict[str, Any]]:
    """Each model on disk, its state and ``plan``'s answer for it (box.plan_for, in the words
    of ``fitbox plan``: box/planning.py ``lines``), or the error it gave."""
    resident = {r.key: r.state.value for r in box.residents()}
    entries = []
    for artifact in box.catalog.artifacts():
        failed = box.crashes.failed(artifact.key)
        state = resident.get(artifact.key) or ("failed" if failed else "unloaded")
        entry: dict[str, Any] = {"model": artifact.name, "state": state}
        try:
            entry["plan"] = box.plan_for(artifact.name)
            entry["lines"] = planning.lines(entry["plan"])
        except (FitboxError, OSError, ValueError) as exc:  # a file gone or unreadable meanwhile
            entry["error"] = str(exc)
        entries.append(entry)
    return entries


_priced: dict[int, tuple[float, tuple[tuple[str, ResidentState], ...], list[dict[str, Any]]]] = {}


def catalog(box: Box) -> list[dict[str, Any]]:
    """The catalog's plans, priced again once ``PLAN_EVERY_S`` passed or the residents moved."""
    now, states = time.monotonic(), _states(box)
    kept = _priced.get(id(box))
    if kept is None or kept[1] != states or now - kept[0] > PLAN_EVERY_S:
        kept = (now, states, _plans(box))
        _priced[id(box)] = kept
    return kept[2]


def _newest_logs(box: Box, models: list[str]) -> dict[str, tuple[str, list[str]]]:
    """Each of ``models``' newest engine log file and its last ``LOG_LINES`` lines."""
    found: dict[str, tuple[str, list[str]]] = {}
    for log in box.child_logs():  # newest first
        row = log.row()
        if row["model"] in models and row["model"] not in found:
            piece = box.child_log(row["name"], None, LOG_LINES)
            if piece is not None:
                lines = piece.text.decode("utf-8", "replace").splitlines()
                found[row["model"]] = (row["name"], lines[-LOG_LINES:])
    return found


async def gather(
    box: Box, store: Store, admin: bool = False, started_at: float | None = None
) -> View:
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
    logs: dict[str, tuple[str, list[str]]] = {}
    if admin:
        models = [r["model"] for r in described]
        with contextlib.suppress(OSError):
            logs = await asyncio.to_thread(_newest_logs, box, models)
    return View(
        counter,
        devices,
        described,
        queued,
        calls,
        evictions,
        refusals,
        problems=store.problems() + box.problems(),
        admin=admin,
        catalog=catalog(box),
        logs=logs,
        version=fitbox.__version__,
        started_at=started_at,
    )


def may_act(request: Request) -> bool:
    """Whether the caller may press the buttons: an admin key or session, or the box itself
    (admitted without a key: the door's management rule)."""
    key = getattr(request.state, "api_key", None)
    return key is None or "admin" in key.scopes


def _view_of(request: Request) -> Any:
    state = request.app.state
    return gather(state.box, state.store, may_act(request), getattr(state, "started_at", None))


async def dashboard(request: Request) -> Response:
    view = await _view_of(request)
    session = session_of(request)
    return HTMLResponse(
        dashboard_html.page(view, session.csrf if session else None),
        headers={"cache-control": "no-store"},
    )


BEAT = b"event: beat\ndata: \n\n"


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
                    view = await _view_of(request)
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
            try:
                async with asyncio.timeout(BEAT_S):
                    await _changed(signal, registry, store, shown, leaving)
            except TimeoutError:
                if not await _still_signed_in(request):
                    return  # its key was revoked, or it signed out: the page hears it
                yield BEAT  # nothing changed: the page hears the box is still there

    return StreamingResponse(
        stream(), media_type="text/event-stream", headers={"cache-control": "no-store"}
    )


async def _still_signed_in(request: Request) -> bool:
    """Whether a signed-in browser's session still stands (its key live, not signed out),
    asked at each beat of its open stream; a caller with a key or none is asked nothing."""
    session = session_of(request)
    if session is None:
        return True
    gate = request.app.state.gate
    check = functools.partial(gate.checker.current, session.key_id, time.time())
    try:
        key = await bounded(check, gate.checker.path, "check the session's key")
    except StoreBusy:
        return True  # asked again at the next beat
    if key is None:
        gate.sessions.close(session.id)
        return False
    return gate.sessions.find(session.id) is not None


def _loading(box: Box) -> bool:
    """A resident is loading: its progress (bytes read) is news each spacing."""
    return any(r.state is ResidentState.STARTING for r in box.residents())


def _states(box: Box) -> tuple[tuple[str, ResidentState], ...]:
    return tuple((r.key, r.state) for r in box.residents())
