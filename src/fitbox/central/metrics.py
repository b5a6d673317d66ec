"""GET /metrics at the central: Prometheus text (the box's /metrics rules: read scope or the
central's own host, through the central's door), every series per box (a ``box`` label: its
id; ``fitbox_central_box_info`` maps it to the name shown).

- each box as the central follows it now: up, its state word (central/page.py state_of),
  draining, its queue and the central's calls in flight on it;
- what it holds: residents by model and state, and per device what its residents hold,
  with the total and free bytes of its newest mirrored reading;
- its calls by outcome, counted from the mirrored call_log. The count is kept per box and
  caught up at each scrape from where the last one stopped: rows up to the first one still
  pending are final and counted once; rows after it are read again each scrape until it ends.

One tally per app (made at its first scrape): two centrals in one process never share one."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response

from fitbox.central.fresh import READINGS_READ
from fitbox.central.mirror import Fleet
from fitbox.central.page import state_of
from fitbox.central.store import CentralStore

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PAGE = 1000
STATES = ("up", "suspected", "connecting", "unreachable", "draining")


class CallTally:
    """Calls by outcome per box, from the mirrored call_log (rows by id, oldest first). A
    box's rows reach the mirror in id order (its one writer gives a row its id and its first
    seq together, and the mirror replays by seq), so the rows already counted keep their
    places and the next scrape starts after them."""

    def __init__(self, store: CentralStore) -> None:
        self.store = store
        self._final: dict[str, Counter[str]] = {}  # counted once: rows before ``_settled``
        self._settled: dict[str, int] = {}  # how many of the box's rows are final, from its first
        self._lock = threading.Lock()  # a cancelled scrape's thread may still be counting

    def count(self, box_ids: list[str]) -> dict[str, Counter[str]]:
        with self._lock:
            return {box_id: self._count(box_id) for box_id in box_ids}

    def _count(self, box_id: str) -> Counter[str]:
        final = self._final.setdefault(box_id, Counter())
        later: Counter[str] = Counter()  # final rows after a pending one: read again next time
        at = self._settled.get(box_id, 0)
        pending = False
        while True:
            rows = self.store.mirrored("call_log", box_id, PAGE, at, False)
            for row in rows:
                outcome = str(row.get("outcome"))
                if outcome == "pending":
                    pending = True
                elif pending:
                    later[outcome] += 1
                else:
                    final[outcome] += 1
                    self._settled[box_id] = self._settled.get(box_id, 0) + 1
            at += len(rows)
            if len(rows) < PAGE:
                return final + later


def _now_families(fleet: Fleet) -> Iterator[Metric]:
    box = ["box"]
    up = GaugeMetricFamily(
        "fitbox_central_box_up", "1 while the box answers its long-poll.", labels=box
    )
    info = GaugeMetricFamily(
        "fitbox_central_box_info",
        "The box's name and version (always 1).",
        labels=["box", "name", "version"],
    )
    state = GaugeMetricFamily(
        "fitbox_central_box_state",
        "1 for the box's state now (up, suspected, connecting, unreachable, draining).",
        labels=["box", "state"],
    )
    queue = GaugeMetricFamily(
        "fitbox_central_box_queue_length", "Calls waiting for room on the box.", labels=box
    )
    flight = GaugeMetricFamily(
        "fitbox_central_box_in_flight", "The central's calls in flight on the box.", labels=box
    )
    residents = GaugeMetricFamily(
        "fitbox_central_residents",
        "Residents by box, model and state.",
        labels=["box", "model", "state"],
    )
    for box_id, link in sorted(fleet.links.items()):
        up.add_metric([box_id], 1 if link.state == "up" else 0)
        info.add_metric([box_id, link.record.shown_name, link.record.version], 1)
        now = state_of(link)
        for word in STATES:
            state.add_metric([box_id, word], 1 if word == now else 0)
        queue.add_metric([box_id], link.waiting)
        flight.add_metric([box_id], link.in_flight)
        found: Counter[tuple[str, str]] = Counter(
            (str(r.get("model")), str(r.get("state"))) for r in link.residents
        )
        for (model, word), n in sorted(found.items()):
            residents.add_metric([box_id, model, word], n)
    yield from (up, info, state, queue, flight, residents)


class CentralMetrics:
    """The central's page: what the links say now (read on the loop: the links are the
    loop's), and what the store says (read in a worker thread)."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.tally = CallTally(fleet.store)

    async def render(self) -> bytes:
        now = list(_now_families(self.fleet))
        links = list(self.fleet.links.values())
        held = [
            (link.record.box_id, str(device), int(size))
            for link in links
            for resident in link.residents
            for device, size in (resident.get("devices") or {}).items()
        ]
        box_ids = [link.record.box_id for link in links]
        return await asyncio.to_thread(self._page, now, box_ids, held)

    def _page(
        self, now: list[Metric], box_ids: list[str], held: list[tuple[str, str, int]]
    ) -> bytes:
        calls = CounterMetricFamily(
            "fitbox_central_calls",
            "Calls the box finished, by outcome (its mirrored call_log).",
            labels=["box", "outcome"],
        )
        for box_id, counts in self.tally.count(box_ids).items():
            for outcome, n in sorted(counts.items()):
                calls.add_metric([box_id, outcome], n)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Families([*now, calls, *self._memory(box_ids, held)]))
        return generate_latest(registry)

    def _memory(self, box_ids: list[str], held: list[tuple[str, str, int]]) -> list[Metric]:
        labels = ["box", "device"]
        total = GaugeMetricFamily(
            "fitbox_central_device_total_bytes",
            "The device's size, as the box's newest reading says.",
            labels=labels,
        )
        free = GaugeMetricFamily(
            "fitbox_central_device_free_bytes",
            "Free memory on the device at the box's newest reading.",
            labels=labels,
        )
        holding = GaugeMetricFamily(
            "fitbox_central_device_held_bytes",
            "What the box's residents hold on the device.",
            labels=labels,
        )
        sums: dict[tuple[str, str], int] = {}
        for box_id, device, size in held:
            sums[(box_id, device)] = sums.get((box_id, device), 0) + int(size)
        for box_id in box_ids:
            newest: dict[str, dict[str, object]] = {}
            for reading in self.fleet.store.mirrored(
                "resource_log", box_id, READINGS_READ, 0, True
            ):
                newest.setdefault(str(reading.get("device")), reading)
            for device, reading in sorted(newest.items()):
                for family, column in ((total, "total_bytes"), (free, "free_bytes")):
                    value = reading.get(column)
                    if isinstance(value, int | float):
                        family.add_metric([box_id, device], value)
        for (box_id, device), size in sorted(sums.items()):
            holding.add_metric([box_id, device], size)
        return [total, free, holding]


class _Families(Collector):
    """Families made for one scrape."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


async def scrape(request: Request) -> Response:
    state = request.app.state
    found: CentralMetrics | None = getattr(state, "central_metrics", None)
    if found is None:  # made at the first scrape: the registry and the tally are the app's
        found = state.central_metrics = CentralMetrics(state.fleet)
    return Response(
        await found.render(), media_type=CONTENT_TYPE, headers={"cache-control": "no-store"}
    )
