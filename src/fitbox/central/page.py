"""GET / at the central: the fleet page (the box's dashboard rules: the central's own host
or an admin key, through the central's door), and GET /dashboard/events: its updates over
SSE, as the box's dashboard does them (server/views/dashboard.py): rendered whole by the
server, the same with JavaScript off, ``<main>`` re-sent when what it shows changed.

What changes it lives in the central's memory (each box's link: its state, counter, queue,
residents), so the stream compares a fingerprint of that once per ``SPACING_S`` and reads
the store (recent rows) only when it moved. Idle times are not the box's ``idle_for_s`` as
it was when the snapshot was read (minutes old on a quiet box): each is the moment the
resident went idle, from the mirrored rows (its newest call's last byte or its engine's
start, whichever came later), and the page counts from there at render time and in the
browser; whether it is serving is its calls still open in the mirrored rows."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response, StreamingResponse

from fitbox.central import page_html
from fitbox.central.backend import StoreUnavailable
from fitbox.central.mirror import BoxLink, Fleet
from fitbox.central.page_html import BoxView, DeviceReading, FleetView
from fitbox.central.store import CentralStore

ROWS = 20  # calls, loads and evictions shown, across the boxes
CALLS_READ = 200  # per box: enough to find each resident's newest call for its idle time
READINGS_READ = 50  # per box: the newest resource reading of each device is among them
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


def _rows(store: CentralStore, box_ids: list[str]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Per box, its newest mirrored rows of the tables the page shows."""
    reads = {
        "call_log": CALLS_READ,
        "children": ROWS,
        "evictions": ROWS,
        "resource_log": READINGS_READ,
    }
    return {
        box_id: {
            table: store.mirrored(table, box_id, most, 0, True) for table, most in reads.items()
        }
        for box_id in box_ids
    }


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def fresh(resident: dict[str, Any], rows: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The box's snapshot of a resident with what its mirrored rows say now: ``calls``, its
    calls still open (the snapshot's count is as of the last change that was not a call's),
    and ``idle_since``, the newest of its calls' last bytes and its engine's start."""
    artifact = resident.get("artifact")
    calls = [c for c in rows["call_log"] if c.get("artifact") == artifact]
    stamps = [c["last_byte_at"] for c in calls if _number(c.get("last_byte_at"))]
    stamps += [
        c["started_at"]
        for c in rows["children"]
        if c.get("artifact") == artifact
        and c.get("ended_at") is None
        and _number(c.get("started_at"))
    ]
    return {
        **resident,
        "calls": sum(1 for c in calls if c.get("outcome") == "pending"),
        "idle_since": float(max(stamps)) if stamps else None,
    }


def _devices(link: BoxLink, readings: list[dict[str, Any]]) -> list[DeviceReading]:
    held: dict[str, int] = {}
    for resident in link.residents:
        for device, size in (resident.get("devices") or {}).items():
            held[device] = held.get(device, 0) + int(size)
    newest: dict[str, dict[str, Any]] = {}
    for reading in readings:  # newest first
        newest.setdefault(str(reading.get("device")), reading)
    totals = {f"gpu{g.get('index')}": g.get("total_bytes") for g in link.health.get("gpus", [])}
    names = sorted({*newest, *totals, *held}, key=lambda d: (d != "host", d))
    return [
        DeviceReading(
            name,
            newest.get(name, {}).get("total_bytes") or totals.get(name),
            newest.get(name, {}).get("free_bytes"),
            held.get(name, 0),
            newest.get(name, {}).get("at"),
        )
        for name in names
    ]


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


def _box_view(link: BoxLink, label: str, rows: dict[str, list[dict[str, Any]]]) -> BoxView:
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
        _devices(link, rows["resource_log"]),
        residents,
    )


def _newest(rows: list[dict[str, Any]], stamp: str) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: r.get(stamp) or 0, reverse=True)[:ROWS]


async def gather(fleet: Fleet) -> FleetView:
    version = fingerprint(fleet)  # read first: a change after it is sent again, never missed
    links = list(fleet.links.values())
    problems: list[str] = []
    try:
        rows = await asyncio.to_thread(_rows, fleet.store, [k.record.box_id for k in links])
    except StoreUnavailable as exc:
        problems.append(f"The central's store did not answer; recent rows are not shown: {exc}")
        rows = {}
    empty: dict[str, list[dict[str, Any]]] = {
        t: [] for t in ("call_log", "children", "evictions", "resource_log")
    }
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


async def events(request: Request) -> Response:
    """GET /dashboard/events?since=VERSION: an update at once if the fleet changed since the
    page was rendered (``since``: its ``data-version``), then one per change."""
    fleet: Fleet = request.app.state.fleet
    since = request.query_params.get("since", "")

    async def stream() -> AsyncIterator[bytes]:
        shown = since
        while True:  # a closed page ends it (starlette cancels on the disconnect)
            if fingerprint(fleet) != shown:
                view = await gather(fleet)
                # a store that did not answer: tried again after the spacing
                shown = "" if view.problems else view.version
                yield _event(view)
            await asyncio.sleep(SPACING_S)

    return StreamingResponse(
        stream(), media_type="text/event-stream", headers={"cache-control": "no-store"}
    )
