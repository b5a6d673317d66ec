"""Facts offered across the fleet: a footprint, a refused window or a measured speed one box
measured is posted to the other boxes (``POST /v1/facts/import``) with the sha256 of the file
it was measured on, so a box holding the same bytes prices its first load from a measurement
instead of an estimate, does not try first a window another box's load was refused at, and
gives ETAs and claims from another box's speeds until it measures its own.

The sha256 comes from the measuring box (``GET /v1/hashes?artifact=PATH``: hashed there
once, kept, and remembered here by the file's path, size and mtime). Each other box that is
up is offered it; a box without a file of that size answers ``no_such_file`` after one stat
per file. A box that comes up (new, back, or the central restarted) is offered every
mirrored fact of the others. Offers are idempotent on the box (origin box and row id),
so offering twice costs a request and never a second row. An offer that fails is logged and
never stops the mirror."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from typing import Any

import httpx

from fitbox.central.mirror import BoxLink, Fleet

log = logging.getLogger(__name__)
# each mirrored table of facts, and the list of the box's offer its rows go in
OFFERED = {
    "measured_footprints": "footprints",
    "refused_windows": "refused_windows",
    "measured_speeds": "speeds",
}
WELCOME_ROWS = 1000  # a box that comes up is offered each other box's newest rows of each
# speeds offered per (box, file, rung): a box prices from the last 20 it imported (box/speeds.py
# SPEED_WINDOW) only until it measures its own, and every call with timings writes one:
# offering each would cost every other box a request, a write and a sync per call anywhere
SPEEDS_OFFERED = 20
OFFER_TIMEOUT_S = 120.0  # the box may hash a file of the same size first, once
FileKey = tuple[str, str, int, int]  # (box id, path, size, mtime_ns) on the measuring box


def newest_speeds(rows: list[dict[str, Any]], most: int = SPEEDS_OFFERED) -> list[dict[str, Any]]:
    """The newest ``most`` speeds of each (file, rung), oldest first (``rows`` oldest first)."""
    kept: dict[tuple[Any, Any], int] = {}
    newest: list[dict[str, Any]] = []
    for row in reversed(rows):
        key = (row.get("artifact"), row.get("rung"))
        if kept.get(key, 0) < most:
            kept[key] = kept.get(key, 0) + 1
            newest.append(row)
    return newest[::-1]


class SpeedQuota:
    """How many speeds of each (box, file, rung) this central has offered: the first
    ``most`` are, the rest are not (see SPEEDS_OFFERED)."""

    def __init__(self, most: int = SPEEDS_OFFERED) -> None:
        self.most = most
        self._offered: dict[tuple[str, Any, Any], int] = {}

    def take(self, box_id: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        taken = []
        for row in rows:
            key = (box_id, row.get("artifact"), row.get("rung"))
            if self._offered.get(key, 0) < self.most:
                self._offered[key] = self._offered.get(key, 0) + 1
                taken.append(row)
        return taken


class FactOffers:
    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self._sha256: dict[FileKey, str] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._speeds = SpeedQuota()
        fleet.listeners.append(self)

    def mirrored(self, link: BoxLink, table: str, rows: list[Any]) -> None:
        kind = OFFERED.get(table)
        if kind is None:
            return
        own = [r for r in rows if isinstance(r, dict) and r.get("origin_box") is None]
        if kind == "speeds":
            own = self._speeds.take(link.record.box_id, own)
        if own:
            to = [
                other
                for other in self.fleet.links.values()
                if other is not link and other.state == "up"
            ]
            self._spawn(self._offer(link, {kind: own}, to))

    def came_up(self, link: BoxLink) -> None:
        self._spawn(self._welcome(link))

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _welcome(self, link: BoxLink) -> None:
        for origin in list(self.fleet.links.values()):
            if origin is link:
                continue
            offered: dict[str, list[dict[str, Any]]] = {}
            for table, kind in OFFERED.items():
                rows = await asyncio.to_thread(
                    self.fleet.store.mirrored, table, origin.record.box_id, WELCOME_ROWS, 0, True
                )
                own = [
                    {k: v for k, v in r.items() if k != "box_id"}
                    for r in reversed(rows)
                    if r.get("origin_box") is None
                ]  # oldest first, as they were measured
                if kind == "speeds":
                    own = newest_speeds(own)
                if own:
                    offered[kind] = own
            if offered:
                await self._offer(origin, offered, [link])

    async def _offer(
        self, origin: BoxLink, offered: dict[str, list[dict[str, Any]]], to: list[BoxLink]
    ) -> None:
        by_file: dict[tuple[str, int, int], dict[str, list[dict[str, Any]]]] = defaultdict(dict)
        for kind, rows in offered.items():
            for row in rows:
                path, size, mtime_ns = (
                    row.get("artifact"),
                    row.get("artifact_size"),
                    row.get("artifact_mtime_ns"),
                )
                if isinstance(path, str) and isinstance(size, int) and isinstance(mtime_ns, int):
                    by_file[(path, size, mtime_ns)].setdefault(kind, []).append(row)
        for (path, size, mtime_ns), kinds in by_file.items():
            try:
                sha256 = await self._sha256_of(origin, path, size, mtime_ns)
            except (httpx.HTTPError, ValueError, KeyError, TypeError, IndexError) as exc:
                log.info(
                    "box %s: no sha256 for %s (%r): its facts are not offered",
                    origin.record.box_id,
                    path,
                    exc,
                )
                continue
            if sha256 is None:
                continue
            offer = {"origin_box": origin.record.box_id, "sha256": sha256, **kinds}
            await asyncio.gather(*(self._post(box, offer) for box in to))

    async def _sha256_of(self, origin: BoxLink, path: str, size: int, mtime_ns: int) -> str | None:
        key = (origin.record.box_id, path, size, mtime_ns)
        if key not in self._sha256:
            response = await self.fleet.client.get(
                f"{origin.record.url}/v1/hashes",
                params={"artifact": path},
                headers=origin.headers,
                timeout=OFFER_TIMEOUT_S,
            )
            if response.status_code == 404:  # the file is gone there
                return None
            response.raise_for_status()
            kept = response.json()["data"][0]
            if kept["bytes"] != size:  # replaced since it was measured: not these bytes
                return None
            self._sha256[key] = str(kept["sha256"])
        return self._sha256[key]

    async def _post(self, box: BoxLink, offer: dict[str, Any]) -> None:
        try:
            response = await self.fleet.client.post(
                f"{box.record.url}/v1/facts/import",
                json=offer,
                headers=box.headers,
                timeout=OFFER_TIMEOUT_S,
            )
        except httpx.HTTPError as exc:
            log.info(
                "box %s: facts not offered (%r); offered again when it is back",
                box.record.box_id,
                exc,
            )
            return
        if response.status_code == 200:
            counts = ", ".join(f"{len(offer[k])} {k}" for k in OFFERED.values() if k in offer)
            log.info(
                "box %s took %s of %s from box %s",
                box.record.box_id,
                counts,
                offer["sha256"][:12],
                offer["origin_box"],
            )
        elif response.status_code != 404:  # 404: no file with these bytes there
            log.warning(
                "box %s refused facts from %s: %s",
                box.record.box_id,
                offer["origin_box"],
                response.text[:300],
            )
