"""GET / at the central: the fleet page (the box's dashboard rules: the central's own host
or an admin key, through the central's door), and GET /dashboard/events: its updates over
SSE, as the box's dashboard does them (server/views/dashboard.py): rendered whole by the
server, the same with JavaScript off, ``<main>`` re-sent when what it shows changed.

What changes it lives in the central's memory (each box's link: its state, counter, queue,
residents), so the stream compares a fingerprint of that once per ``SPACING_S`` and reads
the store (recent rows) only when it moved. Idle times, slots and memory are worked out from
the mirrored rows at render time (central/fresh.py, as GET /v1/fleet does), and the page
counts idle seconds on in the browser."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response, StreamingResponse

from fitbox.central import page_html
from fitbox.central.backend import StoreUnavailable
from fitbox.central.fresh import ROWS, Rows, devices, fresh, no_rows, recent_rows
from fitbox.central.mirror import BoxLink, Fleet
from fitbox.central.page_html import BoxView, FleetView

SPACING_S = 1.0  # the least time between two updates to one page


def state_of(link: BoxLink) -> str:
    """The word the page and /metrics give a box: unreachable (its long-poll failed),
    draining (a person drained it), suspected (its long-poll is late, or a call failed
    before its first byte: no new calls until its mirror hears from it), connecting, or
    up."""
    if link.state == "unreachable":
        return "unreachable"
    if link.record.draining:
        return "draining"
    if link.refused_calls or link.shown_state() == "suspected":
        return "suspected"
    return "up" if link.state == "up" else "connecting"


def fingerprint(fleet: Fleet) -> str:
    """Changes whenever what the page shows of the boxes does (a mirrored change moves a
    box's counter once its rows and snapshots are in)."""
    seen = [
        (
            box_id,
            state_of(link),
            link.counter,
            link.waiting,
            link.in_flight,
            link.record.shown_name,
            link.last_error,
            [(r.get("model"), r.get("state"), r.get("calls")) for r in link.residents],
        )
        for box_id, link in sorted(fleet.links.items())
    ]
    return hashlib.sha256(repr(seen).encode()).hexdigest()[:16]


def labels(links: list[BoxLink]) -> dict[str, str]:
    """Each box's name as the page shows it: with the start of its id where boxes share
    a name (machines made from one image all call themselves the same)."""
    names = [link.record.shown_name for link in links]
    return {
        link.record.box_id: (
            name if names.count(name) == 1 else f"{name} ({link.record.box_id[:8]})"
        )
        for link, name in zip(links, names, strict=True)
    }


def _box_view(link: BoxLink, label: str, rows: Rows) -> BoxView:
    residents = [fresh(r, rows) for r in link.residents]
    return BoxView(
        link.record.box_id,
        label,
        state_of(link),
        link.record.version,
        link.record.url,
        link.last_error,
        link.synced_at or link.record.last_seen_at,
        link.waiting,
        link.in_flight,
        devices(link, rows["resource_log"]),
        residents,
    )


def _newest(rows: list[dict[str, Any]], stamp: str) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: r.get(stamp) or 0, reverse=True)[:ROWS]


async def gather(fleet: Fleet) -> FleetView:
    version = fingerprint(fleet)  # read first: a change after it is sent again, never missed
    links = list(fleet.links.values())
    problems: list[str] = []
    try:
        rows = await asyncio.to_thread(recent_rows, fleet.store, [k.record.box_id for k in links])
    except StoreUnavailable as exc:
        problems.append(f"The central's store did not answer; recent rows are not shown: {exc}")
        rows = {}
    empty = no_rows()
    per_box = [rows.get(k.record.box_id, empty) for k in links]
    every = {t: [row for box in per_box for row in box[t]] for t in empty}
    names = labels(links)
    return FleetView(
        version,
        [
            _box_view(link, names[link.record.box_id], box)
            for link, box in zip(links, per_box, strict=True)
        ],
        _newest(every["call_log"], "received_at"),
        _newest(every["children"], "started_at"),
        _newest(every["evictions"], "at"),
        problems,
        names,
    )


async def fleet_page(request: Request) -> Response:
    view = await gather(request.app.state.fleet)
    return HTMLResponse(page_html.page(view), headers={"cache-control": "no-store"})


def _event(view: FleetView) -> bytes:
    lines = page_html.main(view).splitlines() or [""]
    data = "".join(f"data: {line}\n" for line in lines)
    return f"event: update\nid: {view.version}\n{data}\n".encode()


def _leaving(request: Request) -> asyncio.Event:
    """Set once the central is stopping (server/views/leaving.py; never, for an app run
    without its lifespan)."""
    leaving = getattr(request.app.state, "leaving", None)
    return leaving.event if leaving is not None else asyncio.Event()


async def events(request: Request) -> Response:
    """GET /dashboard/events?since=VERSION: an update at once if the fleet changed since the
    page was rendered (``since``: its ``data-version``), then one per change."""
    fleet: Fleet = request.app.state.fleet
    since = request.query_params.get("since", "")
    leaving = _leaving(request)

    async def stream() -> AsyncIterator[bytes]:
        shown = since
        # a closed page ends it (starlette cancels on the disconnect), and so does a stopping
        # central (uvicorn waits for open responses before a stop completes): the page's
        # EventSource connects again to whatever answers next
        while not leaving.is_set():
            if fingerprint(fleet) != shown:
                view = await gather(fleet)
                # a store that did not answer: tried again after the spacing
                shown = "" if view.problems else view.version
                yield _event(view)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SPACING_S):
                    await leaving.wait()

    return StreamingResponse(
        stream(), media_type="text/event-stream", headers={"cache-control": "no-store"}
    )
