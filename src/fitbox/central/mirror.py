"""Each box as the central follows it: one task per box long-polls the box's change counter
(``/v1/telemetry/state``) and, whenever it moves, replays every cursor table from the cursors
the central stored, then refreshes the box's snapshots (health, residents, models). No
heartbeat: liveness is the long-poll itself. A cut or a restart of either side resumes from
the stored cursors (store.py writes each page with its cursor)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from fitbox.central.backend import StoreUnavailable
from fitbox.central.box_link import BoxHttp
from fitbox.central.store import BoxRecord, CentralStore
from fitbox.engines.http1 import EngineConnectionError
from fitbox.store.db import CURSOR_TABLES, READING_TABLES

log = logging.getLogger(__name__)
LONG_POLL_S = 25.0  # the box answers at most after this long with nothing new (the default
# of FITBOX_CENTRAL_LONG_POLL)
ANSWER_MARGIN_S = 10.0  # a long-poll not answered this long after its wait: the box is frozen
# a long-poll not answered this long after its wait: the box is suspected (no new calls) while
# the mirror still waits for it; a box answers a long-poll when its wait ends, at the latest
SUSPECT_MARGIN_S = 3.0
PAGE = 1000  # the box's MAX_ROWS
RETRY_MOST_S = 5.0
CALLS_SETTLE_S = 1.0  # how long a call-only change waits for the central's own calls to end
SEEN_EVERY_S = 5.0  # the box's last-seen time and counter in the store: for a restart's view
# readings (which move no counter) are taken with any change but a call's, and at a long-poll
# answer when the last were taken longer ago than this: memory readings are never older than
# this and a long-poll's wait together, on a quiet box or one busy with calls
READINGS_EVERY_S = 10.0
MIRRORED_TABLES = (*CURSOR_TABLES, *READING_TABLES)
# what a call writes as it runs: its row, and the speeds its engine's timings measured. A
# change of these alone changes no resident, model or health: no snapshot is read again
CALL_TABLES = frozenset({"call_log", "measured_speeds"})


@dataclass
class BoxLink:
    """What the central knows of one box now. Owned by its follower task, except
    ``in_flight`` and ``refused_calls`` (routing's, on the same loop). Routing sends new
    calls only to a box that ``takes_calls``: up, and not suspected."""

    record: BoxRecord
    state: str = "connecting"  # connecting | up | unreachable
    last_error: str | None = None
    counter: int = -1
    waiting: int = 0
    health: dict[str, Any] = field(default_factory=dict)
    residents: list[dict[str, Any]] = field(default_factory=list)
    models: list[dict[str, Any]] = field(default_factory=list)
    in_flight: int = 0
    refused_calls: bool = False  # a call failed before its first byte; cleared when it answers
    synced_at: float | None = None
    snapshot_at: float | None = None  # when health, residents and models were read
    # per resident model: the seconds a new call would wait for a slot, as the box said at
    # its last long-poll answer (None: unmeasured there), and when that was (monotonic)
    queue_eta: dict[str, float | None] = field(default_factory=dict)
    queue_eta_at: float = 0.0
    readings_at: float = 0.0  # when the readings were last replayed (monotonic)
    # each table's cursor as last stored (take_page), read from the store once
    cursors: dict[str, int] = field(default_factory=dict)
    seen_stored_at: float = 0.0
    # when the long-poll now waiting was sent (monotonic), and when its answer is due by
    polling_since: float | None = None
    answer_due_s: float = LONG_POLL_S + SUSPECT_MARGIN_S
    http: BoxHttp = field(init=False)  # kept connections to the box at record.url
    no_calls: asyncio.Event = field(init=False)  # set while in_flight is 0

    def __post_init__(self) -> None:
        self.http = BoxHttp(self.record.url)
        self.no_calls = asyncio.Event()
        self.no_calls.set()

    def call_started(self) -> None:
        self.in_flight += 1
        self.no_calls.clear()

    def call_ended(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self.no_calls.set()

    async def calls_settled(self) -> None:
        """Until the central's calls on this box end, ``CALLS_SETTLE_S`` at most: a call's
        row opens as it starts and ends before its last byte leaves, so one replay after
        it takes the row in its final form, and none runs beside the reply it relays."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CALLS_SETTLE_S):
                await self.no_calls.wait()

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.record.admin_key}"}

    def suspected(self) -> bool:
        """Its long-poll, or a request of the sync that follows it, is late: a frozen box,
        seen within seconds, long before the mirror gives up on that request
        (``ANSWER_MARGIN_S``, or a sync request's 10 s) and marks it unreachable."""
        since = self.polling_since
        return since is not None and time.monotonic() - since > self.answer_due_s

    def takes_calls(self) -> bool:
        return self.state == "up" and not self.suspected()

    def shown_state(self) -> str:
        return "suspected" if self.state == "up" and self.suspected() else self.state

    def busy(self) -> int:
        return self.waiting + self.in_flight

    def predicted_wait(self, model: str) -> float | None:
        """Seconds a new call to ``model`` (the name the box knows it by) would wait for a
        slot here now: the box's figure, less the time since it said it; 0 for a model not
        resident (nothing queues for its slots); None when the box could not say, or when
        the moment it said has passed without a word since (a call's end moves its counter,
        and the box would have said again: the figure was wrong, a stopped engine, say)."""
        if model not in self.queue_eta:
            return None if any(r.get("model") == model for r in self.residents) else 0.0
        said = self.queue_eta[model]
        if said is None:
            return None
        left = said - (time.monotonic() - self.queue_eta_at)
        return None if said > 0 and left <= 0 else max(0.0, left)

    def heard(self, state: dict[str, Any]) -> None:
        """What a long-poll answer says of the box's queue now."""
        self.waiting = int(state.get("waiting", 0))
        etas = state.get("queue_eta")
        self.queue_eta = {
            str(model): float(eta) if isinstance(eta, int | float) else None
            for model, eta in (etas.items() if isinstance(etas, dict) else ())
        }
        self.queue_eta_at = time.monotonic()

    def describe(self) -> dict[str, Any]:
        return {
            **self.record.public(),
            "state": self.shown_state(),
            "last_error": self.last_error,
            "devices": self.health.get("gpus", []),
            "residents": self.residents,
            "waiting": self.waiting,
            "in_flight": self.in_flight,
            "synced_at": self.synced_at,
            "last_seen_at": self.record.last_seen_at if self.synced_at is None else self.synced_at,
        }


def last_known_models(record: BoxRecord) -> list[dict[str, Any]]:
    """The box's model list as stored at its last sync (none when never synced)."""
    try:
        models = json.loads(record.models) if record.models else []
    except ValueError:
        return []
    return [m for m in models if isinstance(m, dict)] if isinstance(models, list) else []


class Listener(Protocol):
    """Told of what the mirror sees (central/facts.py offers facts to the other boxes)."""

    def mirrored(self, link: BoxLink, table: str, rows: list[Any]) -> None: ...

    def came_up(self, link: BoxLink) -> None: ...


class Fleet:
    """Every registered box and its follower; the one owner of the links."""

    def __init__(
        self, store: CentralStore, client: httpx.AsyncClient, long_poll_s: float = LONG_POLL_S
    ) -> None:
        self.store = store
        self.long_poll_s = long_poll_s
        self.client = client  # management's requests (limits, facts, plans); the mirror's
        # and the forwarded calls go on each link's own connections (BoxLink.http)
        self.links: dict[str, BoxLink] = {}
        self.listeners: list[Listener] = []
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        for record in self.store.boxes():
            self.follow(record)

    def follow(self, record: BoxRecord) -> None:
        """Follow a box (again, at its new address when it moved)."""
        old = self._tasks.pop(record.box_id, None)
        if old is not None:
            old.cancel()
        link = self.links.get(record.box_id)
        if link is None:
            link = self.links[record.box_id] = BoxLink(record)
            link.models = last_known_models(record)
        else:
            moved = link.record.url != record.url
            link.record, link.state, link.counter = record, "connecting", -1
            if moved:  # calls in flight keep their connections; new ones go to the new address
                old_http, link.http = link.http, BoxHttp(record.url)
                closing = asyncio.get_running_loop().create_task(old_http.close())
                self._closing.add(closing)
                closing.add_done_callback(self._closing.discard)
        self._tasks[record.box_id] = asyncio.get_running_loop().create_task(self._follow(link))

    def find(self, name: str) -> BoxLink | None:
        """A box by its id, or by its name when only one box has that name."""
        if name in self.links:
            return self.links[name]
        named = [link for link in self.links.values() if link.record.shown_name == name]
        return named[0] if len(named) == 1 else None

    async def forget(self, box_id: str) -> None:
        """Stop following a box (removed): its task ends, its connections close."""
        task = self._tasks.pop(box_id, None)
        link = self.links.pop(box_id, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if link is not None:
            await link.http.close()

    async def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        for task in self._tasks.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for link in self.links.values():
            await link.http.close()
        for closing in list(self._closing):
            with contextlib.suppress(Exception):
                await closing

    async def _get(self, link: BoxLink, path: str, limit_s: float = 10.0, **params: Any) -> Any:
        return await link.http.get_json(path, link.headers, limit_s, **params)

    async def _follow(self, link: BoxLink) -> None:
        wait = 0.5
        while True:
            try:
                wait_s = self.long_poll_s
                cursors = [f"{t}:{await self._cursor(link, t)}" for t in CURSOR_TABLES]
                link.polling_since = time.monotonic()
                link.answer_due_s = wait_s + SUSPECT_MARGIN_S
                # the answer carries each changed table's first page from these cursors: one
                # request a change (a box that does not know them answers without pages)
                state = await self._get(
                    link,
                    "/v1/telemetry/state",
                    wait_s + ANSWER_MARGIN_S,
                    since=link.counter,
                    wait=wait_s,
                    cursors=",".join(cursors),
                )
                counter = int(state["counter"])
                was = link.state
                link.state, link.last_error, link.refused_calls = "up", None, False
                link.heard(state)
                if counter != link.counter:
                    changed = state.get("changed", CURSOR_TABLES)
                    if set(changed) <= CALL_TABLES and link.synced_at is not None:
                        await link.calls_settled()
                    # the sync's requests are due at once: a box frozen while it is synced
                    # is suspected as soon as one of them is late, as a late long-poll is
                    link.polling_since, link.answer_due_s = time.monotonic(), SUSPECT_MARGIN_S
                    await self.sync(link, changed, state.get("pages") or {})
                    link.counter = counter
                if time.monotonic() - link.readings_at >= READINGS_EVERY_S:
                    link.polling_since, link.answer_due_s = time.monotonic(), SUSPECT_MARGIN_S
                    await self._readings(link)
                link.polling_since = None
                link.synced_at = time.time()
                if link.synced_at - link.seen_stored_at >= SEEN_EVERY_S or was != "up":
                    # not at every counter move: that was a store write for each, two a call
                    await asyncio.to_thread(self.store.seen, link.record.box_id, counter)
                    link.seen_stored_at = link.synced_at
                if was != "up":  # back, or new: what it missed meanwhile
                    for listener in self.listeners:
                        listener.came_up(link)
                wait = 0.5
            except asyncio.CancelledError:
                raise
            except StoreUnavailable as exc:  # the box answered; the central's store did not
                log.warning("box %s: not mirrored for now: %s", link.record.box_id, exc)
                link.last_error, link.polling_since = str(exc), None
                await asyncio.sleep(wait)
                wait = min(wait * 2, RETRY_MOST_S)
            except (EngineConnectionError, TimeoutError, ValueError, KeyError, TypeError) as exc:
                if link.state != "unreachable":
                    log.warning(
                        "box %s (%s) unreachable: %r", link.record.box_id, link.record.url, exc
                    )
                link.state, link.last_error = "unreachable", repr(exc)
                link.polling_since = None
                await asyncio.sleep(wait)
                wait = min(wait * 2, RETRY_MOST_S)

    async def sync(
        self,
        link: BoxLink,
        changed: list[str] | tuple[str, ...],
        pages: dict[str, Any] | None = None,
    ) -> None:
        """Replay the tables the box says changed, each from its cursor (a table replayed
        without need costs a request, never a row twice), starting from the page the
        long-poll answer carried for it, if any. The snapshots and the readings (which move
        no counter) follow any change but a call's: a call changes no resident set, and the
        queue length comes with every long-poll answer."""
        tables = [t for t in changed if t in CURSOR_TABLES]
        calls_only = set(tables) <= CALL_TABLES and link.synced_at is not None
        carried = pages or {}
        await asyncio.gather(
            *(self._replay(link, table, carried.get(table)) for table in tables),
            *([] if calls_only else [self._readings(link)]),
        )
        if calls_only:
            return
        health, residents, models = await asyncio.gather(
            self._get(link, "/health"),
            self._get(link, "/v1/residents"),
            self._get(link, "/v1/models"),
        )
        known = link.models
        link.health, link.residents, link.models = health, residents["data"], models["data"]
        link.snapshot_at = time.time()
        if link.models != known:  # kept for a restart of the central (migration central/0004)
            await asyncio.to_thread(self.store.keep_models, link.record.box_id, link.models)

    async def _readings(self, link: BoxLink) -> None:
        link.readings_at = time.monotonic()
        for table in READING_TABLES:
            await self._replay(link, table)

    async def _cursor(self, link: BoxLink, table: str) -> int:
        """The table's cursor as last stored, read from the store once per box."""
        since = link.cursors.get(table)
        if since is None:
            since = link.cursors[table] = await asyncio.to_thread(
                self.store.cursor, link.record.box_id, table
            )
        return since

    async def _replay(self, link: BoxLink, table: str, carried: Any = None) -> None:
        """From the table's cursor: the page the long-poll carried (read from that cursor),
        then pages asked for until one is not full."""
        box_id = link.record.box_id
        since = await self._cursor(link, table)
        while True:
            page = (
                carried
                if isinstance(carried, dict)
                else await self._get(link, "/v1/telemetry", table=table, since=since, limit=PAGE)
            )
            carried = None
            rows, after = page["rows"], int(page["next"])
            if not rows:
                return
            rejected = await asyncio.to_thread(
                self.store.take_page, box_id, table, page["cursor"], rows, after
            )
            link.cursors[table] = after  # stored with the page (a cancel before this line
            # leaves the older one here: that page is replayed, and upserted, once more)
            for listener in self.listeners:
                listener.mirrored(link, table, rows)
            if rejected:
                log.warning(
                    "box %s: %d %s row(s) kept raw (see mirror_rejects)", box_id, rejected, table
                )
            since = after
            if len(rows) < PAGE:
                return
