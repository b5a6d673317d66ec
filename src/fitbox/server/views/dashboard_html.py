"""The dashboard's HTML, from a view of the box (server/views/dashboard.py gathers it). Pure
functions: every value a client, a file or an engine chose is escaped here, once.

The page works without JavaScript (a reload shows the same); with it, a few lines replace
``<main>`` with each fragment the server sends over SSE, and tick the "loading for" seconds
of a loading resident locally (no request is made for that). A loading resident shows the
bytes of its weights read of all of them, in words and a ``<progress>`` bar."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fitbox.units import format_bytes

from . import dashboard_parts
from .dashboard_assets import SCRIPT as SCRIPT
from .dashboard_assets import STYLE as STYLE  # where the central's page finds it
from .dashboard_cells import _e as _e
from .dashboard_cells import _ms as _ms
from .dashboard_cells import _share as _share
from .dashboard_cells import _table as _table
from .dashboard_cells import _when as _when
from .dashboard_view import DeviceView as DeviceView  # where callers find them
from .dashboard_view import View as View

# the buttons send the session's CSRF token in a header: a form cannot, so they need scripts
NOSCRIPT = (
    '<noscript><p class="muted">The buttons need JavaScript; everything else is here without '
    "it (reload to see what changed).</p></noscript>"
)
BEAT_S = 5.0  # a quiet event stream's beat: a page that hears none for three shows it is cut


def devices(view: View) -> str:
    parts = []
    for d in view.devices:
        held = sum(size for _, _, size in d.holders)
        label = f"{d.id} ({d.kind}{', simulated' if d.simulated else ''})"
        segs = "".join(
            f'<div class="seg {_e(state)}" data-model="{_e(model)}" title="{_e(model)}: '
            f'{_e(format_bytes(size))} ({_e(state)})" style="width:{_share(size, d.capacity)}">'
            f"{_e(model)}</div>"
            for model, state, size in d.holders
        )
        parts.append(
            f'<div class="device" data-device="{_e(d.id)}"><b>{_e(label)}</b> '
            f"{_e(format_bytes(held))} held of {_e(format_bytes(d.capacity))}"
            f'<div class="bar">{segs}</div></div>'
        )
    return "<h2>Devices</h2>" + ("".join(parts) or '<p class="muted">none</p>')


def _loaded(resident: dict[str, Any]) -> str:
    """How much of a loading resident's weights is in: words and a ``<progress>`` bar, both
    plain HTML (JavaScript off shows them; a reload, or the next update, moves them on)."""
    loaded, total = resident.get("bytes_loaded"), resident.get("bytes_total")
    if not total or loaded is None:
        return ""
    share = min(100 * loaded / total, 100)
    words = f"{format_bytes(loaded)} of {format_bytes(total)} ({share:.0f}%)"
    bar = f'<progress value="{int(loaded)}" max="{int(total)}">{share:.0f}%</progress>'
    return (
        f', <span class="loaded" data-bytes-loaded="{int(loaded)}" '
        f'data-bytes-total="{int(total)}">{_e(words)}</span> {bar}'
    )


def _resident_row(r: dict[str, Any], view: View) -> list[str]:
    state = _e(r["state"])
    if r["state"] == "starting" and r.get("load_started_at"):
        since = r["load_started_at"]
        state = (
            f'<span data-loading-since="{since:.3f}">loading for '
            f"{max(view.now - since, 0):.0f} s</span>{_loaded(r)}"
        )
    row = [
        _e(r["model"]),
        state,
        _e(r["device"]),
        _e(r["rung"]),
        _e("" if r.get("task") else r["window"]),
        _e(r.get("task") or ""),  # a task model's (it has no window)
        _e(format_bytes(r["bytes"])),
        _e(r["basis"]),
        _e(r["calls"]),
        _e("yes" if r["pinned"] else ""),
        _e(r["load_seconds"] and f"{r['load_seconds']:.1f} s"),
        dashboard_parts.idle(r, view.now),
    ]
    if view.admin:
        pin = "unpin" if r["pinned"] else "pin"
        row.append(dashboard_parts.buttons(r["model"], ("unload", pin)))
    return row


def residents(view: View) -> str:
    rows = [_resident_row(r, view) for r in view.residents]
    css = [f"resident {r['state']}" for r in view.residents]
    heads = ["model", "state", "device", "rung", "window", "task", "bytes", "basis", "calls"]
    heads += ["pinned"]
    heads += ["load", "idle", *(["actions"] if view.admin else [])]
    return "<h2>Residents</h2>" + _table(heads, rows, "Nothing is loaded.", css)


def _gives_up_in(deadline: float | None, now: float) -> str:
    """The seconds left, as served; the page's script counts them down from ``deadline``."""
    if not deadline:
        return ""
    return f'<span data-deadline="{deadline:.3f}">{max(deadline - now, 0):.0f} s</span>'


def queue(view: View) -> str:
    rows = [
        [
            _e(w.get("call_id")),
            _e(w.get("model")),
            _e(_when(w.get("since"))),
            _gives_up_in(w.get("deadline"), view.now),
            _e(", ".join(w.get("blocked_by") or [])),
        ]
        for w in view.queue
    ]
    return "<h2>Queue</h2>" + _table(
        ["call", "model", "since", "gives up in", "blocked by"], rows, "No call is waiting."
    )


def _audio(call: dict[str, Any]) -> str:
    """A task call's audio seconds: transcribed (in) or spoken (out)."""
    said = [
        f"{call[k]:.1f} s {way}"
        for k, way in (("audio_in_s", "in"), ("audio_out_s", "out"))
        if call.get(k) is not None
    ]
    return ", ".join(said)


def calls(view: View) -> str:
    rows, css = [], []
    for c in view.calls:
        rows.append(
            [
                _e(c["id"]),
                _e(_when(c["received_at"])),
                _e(c.get("model_asked")),
                _e(c.get("outcome")),
                _e(c.get("http_status")),
                _e(c.get("error_code")),
                _e(_ms(c["received_at"], c.get("admitted_at"))),
                _e(_ms(c.get("load_start_at"), c.get("load_ready_at"))),
                _e(_ms(c["received_at"], c.get("first_byte_at"))),
                _e(_ms(c["received_at"], c.get("last_byte_at"))),
                _e(c.get("prompt_tokens")),
                _e(c.get("completion_tokens")),
                _e(_audio(c)),
                _e(c.get("endpoint")),
            ]
        )
        css.append("call" + ("" if c.get("outcome") in ("ok", "pending") else " error"))
    return "<h2>Last calls</h2>" + _table(
        [
            "#",
            "received",
            "model",
            "outcome",
            "status",
            "error",
            "queue",
            "load",
            "ttft",
            "total",
            "prompt",
            "output",
            "audio",
            "route",
        ],
        rows,
        "No calls yet.",
        css,
    )


def evictions(view: View) -> str:
    rows = [
        [
            _e(_when(e["at"])),
            _e(e["model"]),
            _e(e["reason"]),
            _e(e.get("for_model")),
            _e(e.get("idle_seconds") and f"{e['idle_seconds']:.0f} s"),
        ]
        for e in view.evictions
    ]
    return "<h2>Evictions</h2>" + _table(
        ["at", "model", "reason", "for", "idle"], rows, "No evictions."
    )


def refusals(view: View) -> str:
    rows = [
        [
            _e(r["id"]),
            _e(_when(r["received_at"])),
            _e(r.get("model_asked")),
            _e(r.get("error_code")),
            _e(r.get("reason")),
            _e(r.get("http_status")),
        ]
        for r in view.refusals
    ]
    return "<h2>Refusals</h2>" + _table(
        ["call", "at", "model", "code", "reason", "status"], rows, "No refusals."
    )


def problems(view: View) -> str:
    return problems_list(view.problems)


def problems_list(problems: Sequence[str]) -> str:
    """What an operator must fix, as the box's page and the central's show it (nothing
    when all is well)."""
    if not problems:
        return ""
    items = "".join(f"<li>{_e(problem)}</li>" for problem in problems)
    return f'<h2 class="error">Problems</h2><ul class="error problems">{items}</ul>'


def main(view: View) -> str:
    """The part the server re-sends over SSE on each change."""
    sections = (
        dashboard_parts.about,
        problems,
        devices,
        residents,
        dashboard_parts.engine_logs,
        queue,
        dashboard_parts.catalog,
        calls,
        evictions,
        refusals,
    )
    return (
        f'<main data-counter="{view.counter}" data-now="{view.now:.3f}">'
        + "".join(section(view) for section in sections)
        + "</main>"
    )


def page(view: View, csrf: str | None = None) -> str:
    """The whole page; ``csrf``: a signed-in browser's session token (its buttons send it,
    its sign-out form carries it)."""
    meta = f'<meta name="csrf-token" content="{_e(csrf)}">' if csrf else ""
    return (
        f"<!doctype html><html lang=en><meta charset=utf-8>{meta}<title>fitbox</title>"
        f'<style>{STYLE}</style><body data-counter="{view.counter}" data-beat="{BEAT_S:g}">'
        '<div id="disconnected" role="alert" hidden>disconnected: the box does not answer; '
        'reconnecting… (after the box restarted, <a href="/login">sign in</a> again)</div>'
        f"<h1>fitbox</h1>{dashboard_parts.signed_in(csrf)}"
        '<p id="action-result" aria-live="polite"></p>'
        + (NOSCRIPT if view.admin else "")
        + f"{main(view)}<script>{SCRIPT}</script></body></html>"
    )
