"""GET /metrics: Prometheus text exposition (read scope or the box itself: server/door/auth.py).

Four sources, one page:
- the tally (server/views/tally.py): calls, errors, tokens, times, loads, evictions, refusals and
  estimate errors, counted from the store's rows;
- the box as it is now: each device's capacity, free bytes, what fitbox holds and reserves
  there, each resident's state, the queue, the store's write failures and changes, the build;
- the process: CPU, memory, open files, start time (uptime is
  ``time() - process_start_time_seconds``);
- each ready child's own ``/metrics`` (llama-server's ``llamacpp:*``), fetched at scrape
  time with a short bound and re-exported as ``llamacpp_*`` with a ``model`` label; a child
  that does not answer in time is left out, and counted in
  ``fitbox_child_scrape_failures_total``.

One ``CollectorRegistry`` per app: two apps in one process (tests) never share a figure.
"""

from __future__ import annotations

import asyncio
import functools
import platform
import threading
from collections.abc import Iterable, Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response

import fitbox
from fitbox.box.box import Box
from fitbox.box.helper.menu import HELPER
from fitbox.box.resident import Resident
from fitbox.core.types import ResidentState
from fitbox.engines.http1 import EngineConnectionError
from fitbox.probe.host import read_host
from fitbox.store.db import Store
from fitbox.store.waits import bounded

from .tally import Tally

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# a counter's ``*_created`` twin doubles the series for a start time the process family
# already says (process_start_time_seconds); off for the process, as Prometheus' own
# exporters leave it
disable_created_metrics()  # type: ignore[no-untyped-call]
CHILD_TIMEOUT_S = 0.5  # a scrape is not held up by a child that does not answer


class BoxCollector(Collector):
    """The box as it is at scrape time: gauges read by ``read()`` on the event loop (the box's
    state is the loop's), and handed to the page's render off it by ``collect()``."""

    def __init__(self, box: Box, store: Store) -> None:
        self.box, self.store = box, store
        self.families: list[Metric] = []

    def read(self) -> None:
        self.families = list(self._families())

    def collect(self) -> Iterator[Metric]:
        yield from self.families

    def _families(self) -> Iterator[Metric]:
        labels = ["device", "kind", "simulated"]
        capacity = GaugeMetricFamily(
            "fitbox_device_capacity_bytes",
            "What fitbox may fill on the device (capped by every limit tier).",
            labels=labels,
        )
        free = GaugeMetricFamily(
            "fitbox_device_free_bytes",
            "Free memory on the device now (MemAvailable on the host).",
            labels=labels,
        )
        held = GaugeMetricFamily(
            "fitbox_device_held_bytes", "What fitbox's residents hold on the device.", labels=labels
        )
        reserved = GaugeMetricFamily(
            "fitbox_device_reserved_bytes",
            "The part of the held bytes promised to residents still loading.",
            labels=labels,
        )
        residents = self.box.residents()
        holding = _per_device(residents)
        loading = _per_device([r for r in residents if r.state is ResidentState.STARTING])
        free_now = {f"gpu{g.index}": g.free for g in self.box.gpus.read()}
        free_now["host"] = read_host().mem_available
        for device in self.box.snapshot().devices:
            values = [device.id, device.kind.value, "true" if device.simulated else "false"]
            capacity.add_metric(values, device.capacity)
            free.add_metric(values, free_now.get(device.id, 0))
            held.add_metric(values, holding.get(device.id, 0))
            reserved.add_metric(values, loading.get(device.id, 0))
        yield from (capacity, free, held, reserved)
        state = GaugeMetricFamily(
            "fitbox_residents", "Residents by model and state.", labels=["model", "state"]
        )
        for resident in residents:
            state.add_metric([resident.artifact.name, resident.state.value], 1)
        yield state
        yield GaugeMetricFamily(
            "fitbox_queue_length", "Calls waiting for room.", value=len(self.box.queue())
        )
        yield CounterMetricFamily(
            "fitbox_store_write_failures",
            "Store writes that failed since start (health: /v1/telemetry/state).",
            value=self.store.write_failures,
        )
        yield CounterMetricFamily(
            "fitbox_store_changes",
            "Changes the store has committed: its newest event's number.",
            value=self.store.counter,
        )
        info = InfoMetricFamily("fitbox_build", "The fitbox serving, and the Python it runs on.")
        info.add_metric([], {"version": fitbox.__version__, "python": platform.python_version()})
        yield info


def _per_device(residents: Iterable[Resident]) -> dict[str, int]:
    total: dict[str, int] = {}
    for resident in residents:
        for device, size in resident.holdings().items():
            total[device] = total.get(device, 0) + size
    return total


class _Children(Collector):
    """Children's own families, relabelled, for one scrape."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


class Metrics:
    """The app's metrics: its registry, its tally, and how children are scraped."""

    def __init__(self, box: Box, store: Store) -> None:
        self.box, self.registry = box, CollectorRegistry(auto_describe=False)
        self.tally = Tally(store, self.registry)
        self.store_path = store.path
        self.now = BoxCollector(box, store)
        self.registry.register(self.now)
        ProcessCollector(registry=self.registry)  # CPU, memory, open files, start time
        self.child_failures = Counter(
            "fitbox_child_scrape_failures",
            "Child /metrics fetches that failed or timed "
            "out (the child was left out of that scrape).",
            ["model"],
            registry=self.registry,
        )
        self._lock = threading.Lock()  # one catch-up at a time: the cursors are one reader's

    async def render(self) -> bytes:
        """The page. What reads the box runs on the loop; the rest (the tally's catch-up,
        parsing the children's pages, writing the text: ~7 ms a scrape on a loaded 2-core
        box) runs in a worker thread, so a call on the loop meanwhile is not held for all of
        it (bench/operator_overhead.py)."""
        catalog = self.box.catalog
        names = {str(a.path): a.name for a in catalog.artifacts()}
        asked = {
            alias: a.name
            for a in catalog.artifacts()
            for alias in (a.name, *catalog.aliases_of(a.name))
        }
        asked[HELPER] = HELPER  # the helper's calls (box/helper/): no artifact, its own label
        children = await self._children()
        self.now.read()
        page = functools.partial(self._page, names, asked, children)
        return await bounded(page, self.store_path, "count the calls for /metrics")

    def _page(
        self, names: dict[str, str], asked: dict[str, str], children: list[tuple[str, str]]
    ) -> bytes:
        with self._lock:  # taken by the thread: a cancelled scrape's thread still holds it
            self.tally.catch_up(names, asked)
            page = generate_latest(self.registry)
        families = _relabelled(children)
        if families:
            extra = CollectorRegistry(auto_describe=False)
            extra.register(_Children(families))
            page += generate_latest(extra)
        return page

    async def _children(self) -> list[tuple[str, str]]:
        """(model, its child's own page) for each ready child that answered in time."""
        ready = [
            r
            for r in self.box.residents()
            if r.state is ResidentState.READY and r.child is not None and r.engine.metrics_path()
        ]
        if not ready:
            return []
        texts = await asyncio.gather(*(self._fetch(r) for r in ready))
        return [
            (r.artifact.name, text)
            for r, text in zip(ready, texts, strict=True)
            if text is not None
        ]

    async def _fetch(self, resident: Resident) -> str | None:
        """Over the child's own pooled connection (engines/http1.py), as the watchdog's
        health probe goes: no client to build per scrape."""
        assert resident.child is not None
        path = resident.engine.metrics_path() or "/metrics"
        try:
            async with asyncio.timeout(CHILD_TIMEOUT_S):  # not wait_for: it can lose a cancel
                status, body = await resident.child.pool.get(path)
        except (TimeoutError, EngineConnectionError, OSError):
            status, body = 0, b""
        if status != 200:
            self.child_failures.labels(resident.artifact.name).inc()
            return None
        return body.decode("utf-8", "replace")


def _relabelled(children: list[tuple[str, str]]) -> list[Metric]:
    """Each child's own families, merged by name, every sample labelled with its model and
    its name's colons made underscores (llama-server's ``llamacpp:prompt_tokens_total``
    becomes ``llamacpp_prompt_tokens_total``: colons are for recording rules, and
    ``promtool check metrics`` refuses them in an exporter's names)."""
    merged: dict[str, Metric] = {}
    for model, text in children:
        for family in text_string_to_metric_families(text):
            name = family.name.replace(":", "_")
            into = merged.setdefault(name, Metric(name, family.documentation, family.type))
            for sample in family.samples:
                into.samples.append(
                    sample._replace(
                        name=sample.name.replace(":", "_"),
                        labels={**sample.labels, "model": model},
                    )
                )
    return list(merged.values())


async def scrape(request: Request) -> Response:
    found: Metrics = request.app.state.metrics
    return Response(
        await found.render(), media_type=CONTENT_TYPE, headers={"cache-control": "no-store"}
    )
