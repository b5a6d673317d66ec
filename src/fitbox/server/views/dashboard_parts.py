"""The dashboard's operator sections (server/views/dashboard_html.py composes the page):
the box line (version, uptime), the catalog of models on disk with what ``plan`` says of
each, the newest engine log lines of each resident (an admin's view only), idle times,
and the action buttons (rendered for an admin only; the page's script sends them with the
session's CSRF token, server/views/dashboard_assets.py). Pure functions; everything a file,
an engine or a client chose is escaped here."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fitbox.units import format_bytes

from .dashboard_cells import _e, _table
from .dashboard_view import View


def _ago(seconds: float) -> str:
    seconds = max(seconds, 0)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def about(view: View) -> str:
    """fitbox's version and how long this server has run (ticking with JavaScript on)."""
    if not view.version and view.started_at is None:
        return ""
    up = ""
    if view.started_at is not None:
        up = (
            f', up <span class="uptime" data-since="{view.started_at:.3f}">'
            f"{_ago(view.now - view.started_at)}</span>"
        )
    return f'<p class="about">fitbox <span class="version">{_e(view.version)}</span>{up}</p>'


def idle(resident: dict[str, Any], now: float) -> str:
    """How long a resident has served no call (nothing while one is in flight)."""
    seconds = resident.get("idle_for_s")
    if resident.get("calls") or seconds is None or resident.get("state") != "ready":
        return ""
    return f'<span class="idle" data-since="{now - seconds:.3f}">{_ago(seconds)}</span>'


def buttons(model: str, actions: Sequence[str]) -> str:
    """The action buttons of one model: each POSTs /v1/operator/{action} (the page's script)."""
    return " ".join(
        f'<button type="button" data-action="{_e(action)}" data-model="{_e(model)}">'
        f"{_e(action)}</button>"
        for action in actions
    )


def _actions(entry: dict[str, Any]) -> tuple[str, ...]:
    state = entry.get("state")
    if state == "failed":
        return ("clear-failed",)
    if state in ("unloaded", None):
        return ("load", "pin")
    return ()  # a resident's buttons are on its row of the residents' table


def _plan_bytes(plan: dict[str, Any]) -> str:
    total = sum(row.get("total_bytes", 0) for row in plan.get("devices", []))
    if total:
        return format_bytes(total)
    return format_bytes(plan["needed_bytes"]) if plan.get("needed_bytes") else ""


def _catalog_row(entry: dict[str, Any], admin: bool) -> list[str]:
    plan: dict[str, Any] = entry.get("plan") or {}
    words: Sequence[str] = entry.get("lines") or ()
    said = (
        f'<details><summary>{_e(words[0])}</summary><pre class="plan">'
        f"{_e(chr(10).join(words[1:]))}</pre></details>"
        if words
        else _e(entry.get("error", ""))
    )
    decision = plan.get("decision", "error" if entry.get("error") else "")
    row = [
        _e(entry["model"]),
        _e(entry.get("state")),
        f'<span class="decision">{_e(decision)}</span>',
        _e(plan.get("rung")),
        _e(plan.get("window")),
        _e(_plan_bytes(plan)),
        said,
    ]
    if admin:
        row.append(buttons(entry["model"], _actions(entry)))
    return row


def catalog(view: View) -> str:
    """Every model on disk, its state, and what the box would do for it now (``plan``)."""
    rows = [_catalog_row(entry, view.admin) for entry in view.catalog]
    css = [f"model {entry.get('state') or ''}".strip() for entry in view.catalog]
    heads = ["model", "state", "plan", "rung", "window", "bytes", "why"]
    heads += ["actions"] if view.admin else []
    return "<h2>Models on disk</h2>" + _table(heads, rows, "No model on disk.", css)


def engine_logs(view: View) -> str:
    """Each resident's newest engine log lines (an admin's view: paths, ports)."""
    if not view.admin or not view.logs:
        return ""
    parts = []
    for model, (name, lines) in sorted(view.logs.items()):
        text = _e("\n".join(lines)) or "(empty)"
        parts.append(
            f'<div class="engine-log" data-model="{_e(model)}"><b>{_e(model)}</b> '
            f'<a href="/v1/logs/{_e(name)}">{_e(name)}</a><pre class="log">{text}</pre></div>'
        )
    return "<h2>Engine logs</h2>" + "".join(parts)


def signed_in(csrf: str | None) -> str:
    """A signed-in browser's sign-out form (its CSRF token in a hidden field)."""
    if not csrf:
        return ""
    return (
        '<form method="post" action="/logout" class="inline logout">'
        f'<input type="hidden" name="csrf" value="{_e(csrf)}">'
        '<button type="submit">Sign out</button></form>'
    )
