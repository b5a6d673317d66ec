"""The dashboard's HTML, from a view of the box (server/views/dashboard.py gathers it). Pure
functions: every value a client, a file or an engine chose is escaped here, once.

The page works without JavaScript (a reload shows the same); with it, a few lines replace
``<main>`` with each fragment the server sends over SSE, and tick the "loading for" seconds
of a loading resident locally (no request is made for that). A loading resident shows the
bytes of its weights read of all of them, in words and a ``<progress>`` bar."""

from __future__ import annotations

import html
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fitbox.units import format_bytes

STYLE = (
    "body{font:14px system-ui,sans-serif;margin:1.2em;color:#222}h1{font-size:1.3em}"
    "h2{font-size:1.05em;margin:1.2em 0 .4em}table{border-collapse:collapse}"
    "td,th{padding:.2em .6em;border-bottom:1px solid #ddd;text-align:left;white-space:nowrap}"
    ".num{text-align:right}.error{color:#a00}.bar{display:flex;width:40em;max-width:95vw;"
    "height:1.4em;background:#eee;border:1px solid #bbb}.seg{background:#4a8;color:#fff;"
    "overflow:hidden;white-space:nowrap;font-size:.8em;padding:0 .3em;border-right:1px solid"
    " #fff}.seg.starting{background:repeating-linear-gradient(45deg,#e96,#e96 6px,#eb8 6px,"
    "#eb8 12px);color:#000}.seg.stopping{background:#999}.muted{color:#777}"
)
SCRIPT = """
const events = new EventSource("/dashboard/events?since=" + document.body.dataset.counter);
events.addEventListener("update", (e) => {
  const main = document.querySelector("main");
  main.outerHTML = e.data;
  document.body.dataset.counter = document.querySelector("main").dataset.counter;
});
setInterval(() => {
  for (const el of document.querySelectorAll("[data-loading-since]")) {
    const s = Date.now() / 1000 - Number(el.dataset.loadingSince);
    el.textContent = "loading for " + Math.max(0, s).toFixed(0) + " s";
  }
}, 1000);
"""


@dataclass(frozen=True)
class DeviceView:
    id: str
    kind: str
    capacity: int
    simulated: bool
    holders: Sequence[tuple[str, str, int]]  # (model, state, bytes)


@dataclass(frozen=True)
class View:
    counter: int
    devices: Sequence[DeviceView]
    residents: Sequence[dict[str, Any]]
    queue: Sequence[dict[str, Any]]
    calls: Sequence[dict[str, Any]]
    evictions: Sequence[dict[str, Any]]
    refusals: Sequence[dict[str, Any]]
    now: float = field(default_factory=time.time)
    problems: Sequence[str] = ()  # what /health says to fix (the store's, store/db.py)


def _e(value: Any) -> str:
    """Escaped for text and attributes; line breaks as references, so a fragment is one line
    (an SSE data line cannot carry a raw one)."""
    text = html.escape("" if value is None else str(value))
    return text.replace("\r", "&#13;").replace("\n", "&#10;")


def _table(
    heads: Sequence[str], rows: Iterable[Sequence[str]], empty: str, css: Sequence[str] = ()
) -> str:
    """Cells are HTML already escaped; ``css`` names a class per row (or "")."""
    body = [
        f"<tr{f' class={c!r}' if c else ''}>{''.join(f'<td>{cell}</td>' for cell in row)}</tr>"
        for row, c in zip(rows, [*css, *([""] * 10_000)], strict=False)
    ]
    if not body:
        return f'<p class="muted">{_e(empty)}</p>'
    head = "".join(f"<th>{_e(h)}</th>" for h in heads)
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _ms(start: Any, end: Any) -> str:
    return f"{(end - start) * 1000:.0f} ms" if start and end else ""


def _when(stamp: Any) -> str:
    return time.strftime("%H:%M:%S", time.localtime(stamp)) if stamp else ""


def _share(size: int, capacity: int) -> str:
    return f"{min(100 * size / max(capacity, 1), 100):.2f}%"


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


def residents(view: View) -> str:
    rows, css = [], []
    for r in view.residents:
        state = _e(r["state"])
        if r["state"] == "starting" and r.get("load_started_at"):
            since = r["load_started_at"]
            state = (
                f'<span data-loading-since="{since:.3f}">loading for '
                f"{max(view.now - since, 0):.0f} s</span>{_loaded(r)}"
            )
        rows.append(
            [
                _e(r["model"]),
                state,
                _e(r["device"]),
                _e(r["rung"]),
                _e(r["window"]),
                _e(format_bytes(r["bytes"])),
                _e(r["basis"]),
                _e(r["calls"]),
                _e("yes" if r["pinned"] else ""),
                _e(r["load_seconds"] and f"{r['load_seconds']:.1f} s"),
            ]
        )
        css.append(f"resident {r['state']}")
    return "<h2>Residents</h2>" + _table(
        ["model", "state", "device", "rung", "window", "bytes", "basis", "calls", "pinned", "load"],
        rows,
        "Nothing is loaded.",
        css,
    )


def queue(view: View) -> str:
    rows = [
        [
            _e(w.get("call_id")),
            _e(w.get("model")),
            _e(_when(w.get("since"))),
            _e(f"{max(w['deadline'] - view.now, 0):.0f} s" if w.get("deadline") else ""),
            _e(", ".join(w.get("blocked_by") or [])),
        ]
        for w in view.queue
    ]
    return "<h2>Queue</h2>" + _table(
        ["call", "model", "since", "gives up in", "blocked by"], rows, "No call is waiting."
    )


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
    sections = (problems, devices, residents, queue, calls, evictions, refusals)
    return (
        f'<main data-counter="{view.counter}">'
        + "".join(section(view) for section in sections)
        + "</main>"
    )


def page(view: View) -> str:
    return (
        f"<!doctype html><html lang=en><meta charset=utf-8><title>fitbox</title>"
        f'<style>{STYLE}</style><body data-counter="{view.counter}"><h1>fitbox</h1>'
        f"{main(view)}<script>{SCRIPT}</script></body></html>"
    )
