"""GET /calls: a read-only HTML page of the latest calls, for management: the box itself
(under a Host naming the box), an admin key from anywhere, or a browser signed in with one
at /login (server/door/auth.py: ADMIN, and a session route). Anyone else gets the door's
OpenAI error body (a browser that has not signed in is sent to /login)."""

from __future__ import annotations

import html
import sqlite3
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from fitbox.store.db import Store
from fitbox.store.waits import read

COLUMNS = (
    ("id", "#"),
    ("received", "received"),
    ("model_asked", "model"),
    ("rung", "rung"),
    ("window", "window"),
    ("outcome", "outcome"),
    ("http_status", "status"),
    ("error_code", "error"),
    ("ttfb", "first byte"),
    ("total", "total"),
    ("prompt_tokens", "prompt"),
    ("completion_tokens", "output"),
    ("decode", "tokens/s"),
    ("central_key", "central key"),  # the central key a call through the central came with
)
STYLE = (
    "body{font:14px system-ui,sans-serif;margin:1.5em}table{border-collapse:collapse}"
    "td,th{padding:.25em .6em;border-bottom:1px solid #ddd;text-align:right}"
    "td:nth-child(3),th:nth-child(3){text-align:left}.error{color:#a00}"
)


def _cells(row: dict[str, Any]) -> dict[str, str]:
    def ms(start: Any, end: Any) -> str:
        return f"{(end - start) * 1000:.0f} ms" if start and end else ""

    decode = row.get("decode_per_token_ms")
    return {
        **{k: "" if row.get(k) is None else str(row[k]) for k, _ in COLUMNS},
        "received": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["received_at"])),
        "ttfb": ms(row.get("received_at"), row.get("first_byte_at")),
        "total": ms(row.get("received_at"), row.get("last_byte_at")),
        "decode": f"{1000 / decode:.1f}" if decode else "",
        "central_key": (
            f"{row.get('central_key_name') or ''} ({row['central_key']})"
            if row.get("central_key")
            else ""
        ),
    }


async def recent_calls(store: Store, limit: int) -> list[dict[str, Any]]:
    """The newest ``limit`` call rows, newest first, read off the loop (store/waits.py). A
    call whose client got its answer whole is in them: its row was committed first."""

    def select(conn: sqlite3.Connection) -> list[dict[str, Any]]:
        rows = conn.execute("SELECT * FROM call_log ORDER BY id DESC LIMIT ?", (limit,))
        return [dict(row) for row in rows]

    return await read(store.path, select, "read the call log")


async def calls_page(request: Request) -> Response:
    store: Store = request.app.state.store
    limit = 200
    calls = await recent_calls(store, limit)
    head = "".join(f"<th>{html.escape(label)}</th>" for _, label in COLUMNS)
    body = []
    for row in calls:
        cells = _cells(row)
        css = ' class="error"' if row.get("outcome") not in ("ok", "pending") else ""
        body.append(
            f"<tr{css}>"
            + "".join(f"<td>{html.escape(cells[k])}</td>" for k, _ in COLUMNS)
            + "</tr>"
        )
    page = (
        f"<!doctype html><meta charset=utf-8><title>fitbox calls</title>"
        f"<style>{STYLE}</style><h1>fitbox: the latest {len(calls)} calls</h1>"
        f"<table><tr>{head}</tr>{''.join(body)}</table>"
    )
    return HTMLResponse(page, headers={"cache-control": "no-store"})
