"""Telemetry for readers and mirrors (read scope): the change counter with long-polling, and
cursor replay of the cursor tables by ``seq`` (see migrations/0006_events.sql).

A mirror keeps one cursor per table: ``GET /v1/telemetry?table=T&since=<cursor>`` returns
rows whose last change is after the cursor, oldest change first, and ``next`` to store. A
row changed again after it was read comes back once per change, in its newest form.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from fitbox.box.box import Box
from fitbox.errors import InvalidRequest
from fitbox.store.db import CURSOR_TABLES, Store

MAX_WAIT_S = 60.0
MAX_ROWS = 1000


class ChangeSignal:
    """Wakes every long-poller when the store's counter moves (fired from the loop)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def fire(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()

    async def wait(self, limit_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), limit_s)


def _number(request: Request, name: str, default: float, low: float, high: float) -> float:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise InvalidRequest(f"Query parameter '{name}' must be a number.", param=name) from None
    if not low <= value <= high:
        raise InvalidRequest(f"Query parameter '{name}' must be within {low:g}..{high:g}.",
                             param=name)  # fmt: skip
    return value


async def state(request: Request) -> Response:
    """GET /v1/telemetry/state?since=K&wait=N: answers once the counter passes K, or after
    N seconds (at most 60) with the counter as it is."""
    store: Store = request.app.state.store
    box: Box = request.app.state.box
    signal: ChangeSignal = request.app.state.changes
    since = int(_number(request, "since", -1, -1, 2**62))
    wait = _number(request, "wait", 0, 0, MAX_WAIT_S)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while store.counter <= since and loop.time() < deadline:
        await signal.wait(deadline - loop.time())
    return JSONResponse({
        "counter": store.counter,
        "residents": len(box.residents()),
        "waiting": len(box.queue()),
        "store": store.health(),
    })  # fmt: skip


async def rows(request: Request) -> Response:
    """GET /v1/telemetry?table=T&since=SEQ&limit=L -> {"rows": [...], "next": SEQ}."""
    store: Store = request.app.state.store
    table = request.query_params.get("table", "")
    if table not in CURSOR_TABLES:
        raise InvalidRequest(f"Query parameter 'table' must be one of {', '.join(CURSOR_TABLES)}.",
                             param="table")  # fmt: skip
    since = int(_number(request, "since", 0, 0, 2**62))
    limit = int(_number(request, "limit", 100, 1, MAX_ROWS))
    uri = f"{store.path.as_uri()}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:  # a reader of its own
        conn.row_factory = sqlite3.Row
        found = [dict(r) for r in conn.execute(
            f"SELECT * FROM {table} WHERE seq > ? ORDER BY seq LIMIT ?",  # noqa: S608
            (since, limit))]  # fmt: skip
    return JSONResponse({"table": table, "rows": found,
                         "next": found[-1]["seq"] if found else since})  # fmt: skip
