"""The fleet page's HTML, from a view of the fleet (central/page.py gathers it). Pure
functions: every value a box, a client or a file chose is escaped here, once (the box's
dashboard's helpers, server/views/dashboard_html.py).

The page works without JavaScript (a reload shows the same); with it, a few lines replace
``<main>`` with each fragment the central sends over SSE, and tick each idle resident's
"idle for" seconds and each "s ago" locally from the moment they count from (no request is
made for that)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fitbox.server.views.dashboard_html import STYLE as BOX_STYLE
from fitbox.server.views.dashboard_html import _e, _ms, _share, _table, _when, problems_list
from fitbox.units import format_bytes

STYLE = (
    BOX_STYLE + ".state{font-weight:bold}.state.up{color:#284}.state.suspected,.state.connecting"
    "{color:#b60}.state.unreachable{color:#a00}.state.draining{color:#569}"
)
SCRIPT = """
const events = new EventSource("/dashboard/events?since=" + document.body.dataset.version);
events.addEventListener("update", (e) => {
  document.querySelector("main").outerHTML = e.data;
  document.body.dataset.version = document.querySelector("main").dataset.version;
});
setInterval(() => {
  for (const el of document.querySelectorAll("[data-idle-since]")) {
    const s = Date.now() / 1000 - Number(el.dataset.idleSince);
    el.textContent = "idle for " + Math.max(0, s).toFixed(0) + " s";
  }
  for (const el of document.querySelectorAll("[data-ago]")) {
    const s = Date.now() / 1000 - Number(el.dataset.ago);
    el.textContent = Math.max(0, s).toFixed(0) + " s ago";
  }
}, 1000);
"""


@dataclass(frozen=True)
class DeviceReading:
    device: str
    total: int | None  # bytes, as the box's last reading (or its /health) said
    free: int | None
    held: int  # what the box's residents hold there now (its residents snapshot)
    read_at: float | None  # when the box read ``free``


@dataclass(frozen=True)
class BoxView:
    box_id: str
    name: str
    state: str  # up | suspected | connecting | unreachable | draining
    version: str
    url: str
    last_error: str | None
    last_seen_at: float | None
    waiting: int
    in_flight: int
    devices: Sequence[DeviceReading]
    # each the box's own /v1/residents entry, with ``idle_since`` (epoch seconds, or None)
    residents: Sequence[dict[str, Any]]


@dataclass(frozen=True)
class FleetView:
    version: str  # changes when what the page shows of the boxes does
    boxes: Sequence[BoxView]
    calls: Sequence[dict[str, Any]]  # mirrored call_log rows, newest first, each with box
    loads: Sequence[dict[str, Any]]  # mirrored children rows (an engine started for a model)
    evictions: Sequence[dict[str, Any]]
    problems: Sequence[str] = ()
    names: dict[str, str] = field(default_factory=dict)  # box id: the name shown
    now: float = field(default_factory=time.time)


def _ago(view: FleetView, stamp: float | None) -> str:
    """How long ago, counted on in the browser (``data-ago``) until the next update."""
    if not stamp:
        return "never"
    return f'<span data-ago="{stamp:.3f}">{max(view.now - stamp, 0):.0f} s ago</span>'


def _box(view: FleetView, row: dict[str, Any]) -> str:
    box_id = str(row.get("box_id", ""))
    return _e(view.names.get(box_id, box_id[:8]))


def boxes(view: FleetView) -> str:
    rows, css = [], []
    for b in view.boxes:
        rows.append(
            [
                f'<span class="name">{_e(b.name)}</span>',
                _e(b.box_id),
                f'<span class="state {_e(b.state)}">{_e(b.state)}</span>',
                _e(b.waiting),
                _e(b.in_flight),
                _e(b.version),
                _e(b.url),
                _ago(view, b.last_seen_at),
                f'<span class="error">{_e(b.last_error)}</span>' if b.last_error else "",
            ]
        )
        css.append(f"box {b.state}")
    return "<h2>Boxes</h2>" + _table(
        ["name", "id", "state", "queued", "in flight", "version", "address", "heard", "error"],
        rows,
        "No box has joined: fitbox serve --central URL --central-key KEY.",
        css,
    )


def memory(view: FleetView) -> str:
    parts = []
    for b in view.boxes:
        for d in b.devices:
            total = d.total or 0
            words = f"{format_bytes(d.held)} held by fitbox of {format_bytes(total)}"
            if d.free:
                words = f"{_e(words)}, {_e(format_bytes(d.free))} free ({_ago(view, d.read_at)})"
            else:
                words = _e(words)
            bar = (
                f'<div class="seg" style="width:{_share(d.held, total)}">'
                f"{_e(format_bytes(d.held))}</div>"
                if total and d.held
                else ""
            )
            parts.append(
                f'<div class="device" data-box="{_e(b.box_id)}" data-device="{_e(d.device)}">'
                f"<b>{_e(b.name)} {_e(d.device)}</b> {words}"
                f'<div class="bar">{bar}</div></div>'
            )
    return "<h2>Memory</h2>" + ("".join(parts) or '<p class="muted">no readings yet</p>')


def _idle(view: FleetView, resident: dict[str, Any]) -> str:
    if resident.get("calls"):
        return _e(f"serving {resident['calls']} call(s)")
    since = resident.get("idle_since")
    if resident.get("state") != "ready" or not since:
        return ""
    return f'<span data-idle-since="{since:.3f}">idle for {max(view.now - since, 0):.0f} s</span>'


def residents(view: FleetView) -> str:
    rows, css = [], []
    for b in view.boxes:
        for r in b.residents:
            rows.append(
                [
                    _e(b.name),
                    _e(r.get("model")),
                    _e(r.get("state")),
                    _e(r.get("device")),
                    _e(format_bytes(r.get("bytes") or 0)),
                    _e(r.get("window")),
                    _idle(view, r),
                ]
            )
            css.append(f"resident {r.get('state')}")
    return "<h2>Loaded</h2>" + _table(
        ["box", "model", "state", "device", "bytes", "window", "idle"],
        rows,
        "Nothing is loaded on any box.",
        css,
    )


def calls(view: FleetView) -> str:
    rows, css = [], []
    for c in view.calls:
        rows.append(
            [
                _box(view, c),
                _e(c.get("id")),
                _e(_when(c.get("received_at"))),
                _e(c.get("model_asked")),
                _e(c.get("outcome")),
                _e(c.get("http_status")),
                _e(c.get("error_code")),
                _e(_ms(c.get("load_start_at"), c.get("load_ready_at"))),
                _e(_ms(c.get("received_at"), c.get("last_byte_at"))),
                _e(c.get("central_key_name") or c.get("central_key")),  # the key that made it
            ]
        )
        css.append("call" + ("" if c.get("outcome") in ("ok", "pending") else " error"))
    return "<h2>Last calls</h2>" + _table(
        ["box", "#", "received", "model", "outcome", "status", "error", "load", "total", "key"],
        rows,
        "No calls yet.",
        css,
    )


def loads(view: FleetView) -> str:
    rows = [
        [
            _box(view, c),
            _e(_when(c.get("started_at"))),
            _e(str(c.get("artifact") or "").rsplit("/", 1)[-1]),
            _e(_when(c.get("ended_at"))),
            _e(c.get("ended_how")),
        ]
        for c in view.loads
    ]
    return "<h2>Loads</h2>" + _table(
        ["box", "started", "file", "ended", "how"], rows, "No engine has started."
    )


def evictions(view: FleetView) -> str:
    rows = [
        [
            _box(view, e),
            _e(_when(e.get("at"))),
            _e(e.get("model")),
            _e(e.get("reason")),
            _e(e.get("for_model")),
            _e(e.get("idle_seconds") and f"{e['idle_seconds']:.0f} s"),
        ]
        for e in view.evictions
    ]
    return "<h2>Evictions</h2>" + _table(
        ["box", "at", "model", "reason", "for", "idle"], rows, "No evictions."
    )


def problems(view: FleetView) -> str:
    return problems_list(view.problems)


def main(view: FleetView) -> str:
    """The part the central re-sends over SSE on each change."""
    sections = (problems, boxes, memory, residents, calls, loads, evictions)
    return (
        f'<main data-version="{_e(view.version)}">'
        + "".join(section(view) for section in sections)
        + "</main>"
    )


def page(view: FleetView) -> str:
    return (
        "<!doctype html><html lang=en><meta charset=utf-8><title>fitbox fleet</title>"
        f'<style>{STYLE}</style><body data-version="{_e(view.version)}">'
        f"<h1>fitbox fleet</h1>{main(view)}<script>{SCRIPT}</script></body></html>"
    )
