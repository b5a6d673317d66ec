"""Telemetry for readers and mirrors (read scope): the change counter with long-polling, and
cursor replay of the cursor tables by ``seq`` (see migrations/0006_events.sql).

A mirror keeps one cursor per table: ``GET /v1/telemetry?table=T&since=<cursor>`` returns
rows whose last change is after the cursor, oldest change first, and ``next`` to store. A
row changed again after it was read comes back once per change, in its newest form.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import sqlite3

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from fitbox.box.box import Box
from fitbox.errors import InvalidRequest
from fitbox.server.door.bodies import query_number
from fitbox.store.db import CURSOR_TABLES, READING_TABLES, Store
from fitbox.store.waits import read, writing

MAX_WAIT_S = 60.0
MAX_ROWS = 1000
COMMIT_WAIT_S = 5.0  # the longest a replay of readings waits for the queued ones to commit


class ChangeSignal:
    """Wakes every long-poller when the store's counter moves (fired from the loop)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def fire(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()

    async def wait(self, limit_s: float, leaving: asyncio.Event | None = None) -> None:
        """Until the counter moves, ``limit_s`` passes, or ``leaving`` is set."""
        if leaving is None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(limit_s):  # not wait_for: it can swallow a cancel
                    await self._event.wait()
            return
        waits = [asyncio.ensure_future(self._event.wait()), asyncio.ensure_future(leaving.wait())]
        try:
            await asyncio.wait(waits, timeout=limit_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()


async def state(request: Request) -> Response:
    """GET /v1/telemetry/state?since=K&wait=N: answers once the counter passes K, or after
    N seconds (at most 60) with the counter as it is, or at once when the box is stopping
    (``"stopping": true``: uvicorn waits for open responses before a stop completes, so a
    poll that slept on would hold the stop for its grace period and then be cut off)."""
    store: Store = request.app.state.store
    box: Box = request.app.state.box
    signal: ChangeSignal = request.app.state.changes
    leaving: asyncio.Event = request.app.state.leaving.event
    since = int(query_number(request, "since", -1, -1, 2**62))
    wait = query_number(request, "wait", 0, 0, MAX_WAIT_S)
    cursors = _cursors(request)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while store.counter <= since and loop.time() < deadline and not leaving.is_set():
        await signal.wait(deadline - loop.time(), leaving)
    counter = store.counter  # before the reads: a row changed after it is read again

    def replay(conn: sqlite3.Connection) -> tuple[list[str], dict[str, dict[str, object]]]:
        changed = _changed_since(conn, since)
        pages = {
            table: _page(conn, table, cursors[table], MAX_ROWS)
            for table in changed
            if table in cursors
        }
        return changed, pages

    changed, pages = await read(store.path, replay, "read the changed rows")
    answer: dict[str, object] = {
        "counter": counter,
        "changed": changed,
        "residents": len(box.residents()),
        "waiting": len(box.queue()),
        # per ready resident: the seconds a new call would wait for a slot (None: unmeasured)
        "queue_eta": box.queue_etas(),
        "store": store.health(),
        "stopping": leaving.is_set(),
    }
    if cursors:
        answer["pages"] = pages
    return JSONResponse(answer)


def _cursors(request: Request) -> dict[str, int]:
    """``cursors=call_log:120,children:7``: the reader's cursor of each cursor table it
    wants the changed rows of in the answer itself (a mirror: one request a change, not a
    long-poll and then a replay of each table)."""
    raw = request.query_params.get("cursors", "")
    found: dict[str, int] = {}
    for item in filter(None, raw.split(",")):
        table, _, cursor = item.partition(":")
        if (
            table not in CURSOR_TABLES
            or not (cursor.isascii() and cursor.isdigit())
            or int(cursor) > 2**62
        ):
            raise InvalidRequest(
                f"Query parameter 'cursors' is TABLE:CURSOR,…, each TABLE one "
                f"of {', '.join(CURSOR_TABLES)}; {item!r} is not.",
                param="cursors",
            )
        found[table] = int(cursor)
    return found


def _changed_since(conn: sqlite3.Connection, since: int) -> list[str]:
    """The cursor tables with an event after ``since`` (all of them for no cursor): a
    mirror replays only these."""
    if since < 0:
        return list(CURSOR_TABLES)
    found = {
        row[0] for row in conn.execute("SELECT DISTINCT tbl FROM events WHERE id > ?", (since,))
    }
    return [t for t in CURSOR_TABLES if t in found]


def _as_json(row: sqlite3.Row) -> dict[str, object]:
    """A stored row as JSON can carry it: blobs as hex, a number that is not finite (SQLite
    keeps Infinity; JSON has no word for it) as null. A bad row never breaks a listing."""
    out: dict[str, object] = {}
    for key, value in dict(row).items():
        if isinstance(value, bytes):
            value = value.hex()
        elif isinstance(value, float) and not math.isfinite(value):
            value = None
        out[key] = value
    return out


async def rows(request: Request) -> Response:
    """GET /v1/telemetry?table=T&since=CURSOR&limit=L -> {"rows": [...], "next": CURSOR}.
    Event tables replay by ``seq`` (a changed row comes back in its newest form); readings
    (resource_log) replay by ``id``: they are written once and never change."""
    store: Store = request.app.state.store
    table = request.query_params.get("table", "")
    tables = (*CURSOR_TABLES, *READING_TABLES)
    if table not in tables:
        raise InvalidRequest(
            f"Query parameter 'table' must be one of {', '.join(tables)}.", param="table"
        )
    since = int(query_number(request, "since", 0, 0, 2**62))
    limit = int(query_number(request, "limit", 100, 1, MAX_ROWS))
    # readings are committed lazily: the ones taken so far first (unless writes are being
    # refused now: they wait in memory, and waiting here would only delay the answer)
    if table in READING_TABLES and writing(store):
        await store.committed(store.barrier(), COMMIT_WAIT_S)
    page = await read(store.path, lambda conn: _page(conn, table, since, limit), "read rows")
    return JSONResponse(page)


def _page(conn: sqlite3.Connection, table: str, since: int, limit: int) -> dict[str, object]:
    """One page of a table's replay from ``since``: its rows, and the cursor to go on from."""
    cursor = "id" if table in READING_TABLES else "seq"
    found = [
        _as_json(r)
        for r in conn.execute(
            f"SELECT * FROM {table} WHERE {cursor} > ? ORDER BY {cursor} LIMIT ?",  # noqa: S608
            (since, limit),
        )
    ]
    return {
        "table": table,
        "cursor": cursor,
        "rows": found,
        "next": found[-1][cursor] if found else since,
    }


WITHHELD = {"api_keys": {"salt", "digest"}}  # secrets never leave the box


def _catalog(conn: sqlite3.Connection) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for name, kind in conn.execute(
        "SELECT name, type FROM sqlite_master WHERE type IN ('table', 'view') "
        "AND name NOT LIKE 'sqlite_%' ORDER BY name"
    ):
        hidden = WITHHELD.get(name, set())
        columns = [c[1] for c in conn.execute(f"PRAGMA table_info({name})") if c[1] not in hidden]
        out[name] = {"kind": kind, "columns": columns, "withheld": sorted(hidden)}
    return out


async def tables(request: Request) -> Response:
    """GET /v1/telemetry/tables: every table and view, with the columns a reader may see."""
    store: Store = request.app.state.store
    found = await read(store.path, _catalog, "list the tables")
    return JSONResponse({"object": "list", "data": [{"name": n, **v} for n, v in found.items()]})


async def table_rows(request: Request) -> Response:
    """GET /v1/telemetry/rows?table=T[&order=COLUMN&desc=true&limit=L&offset=N]: any table or
    view, read-only, secrets withheld; ordering only by one of its visible columns."""
    store: Store = request.app.state.store
    table = request.query_params.get("table", "")
    known = await read(store.path, _catalog, "list the tables")
    if table not in known:
        raise InvalidRequest(
            f"No table or view {table!r}; GET /v1/telemetry/tables lists them.", param="table"
        )
    columns = list(known[table]["columns"])  # type: ignore[call-overload]
    order = request.query_params.get("order") or columns[0]
    if order not in columns:
        raise InvalidRequest(
            f"Rows of {table} can be ordered by {', '.join(columns)}.", param="order"
        )
    desc = request.query_params.get("desc", "").lower() in ("1", "true", "yes")
    limit = int(query_number(request, "limit", 100, 1, MAX_ROWS))
    offset = int(query_number(request, "offset", 0, 0, 2**62))
    select = ", ".join(f'"{c}"' for c in columns)
    sql = (
        f'SELECT {select} FROM "{table}" ORDER BY "{order}" {"DESC" if desc else "ASC"} '  # noqa: S608
        "LIMIT ? OFFSET ?"
    )
    found = await read(
        store.path,
        lambda conn: [_as_json(r) for r in conn.execute(sql, (limit, offset))],
        "read rows",
    )
    return JSONResponse({"table": table, "rows": found})


async def scout_findings(request: Request) -> Response:
    """GET /v1/telemetry/scout[?limit=L&servable=true]: the newest findings of `fitbox scout`
    (migrations/0016), newest first; a mirror replays them by seq through /v1/telemetry."""
    store: Store = request.app.state.store
    limit = int(query_number(request, "limit", 100, 1, MAX_ROWS))
    only = request.query_params.get("servable", "").lower() in ("1", "true", "yes")
    where = "WHERE servable = 1 " if only else ""
    sql = f"SELECT * FROM scout_findings {where}ORDER BY id DESC LIMIT ?"  # noqa: S608
    found = await read(
        store.path,
        lambda conn: [_as_json(r) for r in conn.execute(sql, (limit,))],
        "read the findings",
    )
    return JSONResponse({"object": "list", "data": found})
