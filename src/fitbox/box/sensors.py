"""Sensor readings: host RAM, swap and CPU, and each GPU's memory, every
``reading_interval`` seconds into ``resource_log`` (store/db.py ``readings``: no event, so
the change counter stays still), pruned to ``reading_retention``; which cores stay busy
with other work, for claims (``BusyCores``; FORMULAS.md §CPU claims). A process that
appears on a GPU and that fitbox did not start is scouted: which model files it runs on."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import psutil

from fitbox.config import Config
from fitbox.models.scout import scout
from fitbox.probe.gpus import GpuProbe, GpuReading
from fitbox.probe.host import CoreBusyCounter, HostUsage, read_usage, start_cpu_counter
from fitbox.store.db import Store

from .growth import refresh_held_now
from .residents import Registry

PRUNE_EVERY_S = 60.0


class BusyCores:
    """Physical cores busy with other work: a core none of fitbox's engines holds whose
    busiest logical CPU read at least ``percent`` busy for ``readings`` readings in a row.
    One reading below, or one of our engines taking the core, clears it. Owned by the
    sensor loop (``observe``); claims read ``busy()``.

    Work on cores our engines hold is invisible per core, and a swap's victim held every
    core the newcomer is then lent. So the whole box is read too: every CPU's busy percent
    summed, less what our engines ran (``engines_percent``). Other work worth ``percent`` of
    a core for ``readings`` readings in a row marks the reserved core busy, so it is not
    lent (core/claims.py): llama.cpp run with a thread per core beside other work waits on
    its spin barriers (measured here: a 1-token call 0.4-1.3 s at -t 2 against 0.04-0.13 s at
    -t 1, and the first call after a load 4.6-6.3 s against 0.9-1.8 s)."""

    def __init__(self, cores: Mapping[int, frozenset[int]], percent: float, readings: int) -> None:
        self.cores, self.percent, self.readings = dict(cores), percent, readings
        self._streak = dict.fromkeys(self.cores, 0)
        self._box_streak = 0  # readings in a row with other work worth a core, box-wide
        self._quiet_streak = 0  # readings in a row with less, box-wide
        self.reserved = min(self.cores) if len(self.cores) > 1 else None

    def observe(
        self,
        busy_by_cpu: Mapping[int, float],
        held: Collection[int],
        engines_percent: float | None = None,
    ) -> None:
        """One reading. ``engines_percent``: our engines' CPU use since the last reading (100 a
        core); None: not read, the box-wide rule stays still."""
        for core, cpus in self.cores.items():
            level = max((busy_by_cpu.get(cpu, 0.0) for cpu in cpus), default=0.0)
            sustained = core not in held and level >= self.percent
            self._streak[core] = self._streak[core] + 1 if sustained else 0
        if engines_percent is not None:
            other = sum(busy_by_cpu.values()) - engines_percent
            self._box_streak = self._box_streak + 1 if other >= self.percent else 0
            self._quiet_streak = 0 if other >= self.percent else self._quiet_streak + 1

    def settled(self) -> bool:
        """Other work stayed under ``percent`` of a core box-wide for ``readings`` readings in
        a row: quiet as long as busy must last. An engine is widened onto every core only
        then (box/warmth.py); one reading below clears :meth:`busy`, and a thread per core
        beside other work is what stalls llama.cpp."""
        return self._quiet_streak >= self.readings

    def busy(self) -> tuple[int, ...]:
        found = {c for c, n in self._streak.items() if n >= self.readings}
        if self.reserved is not None and self._box_streak >= self.readings:
            found.add(self.reserved)
        return tuple(sorted(found))


class EngineCpu:
    """Our engines' CPU use between two of its reads, in percent of one core: what the
    box-wide reading of :class:`BusyCores` takes away as not other work."""

    def __init__(self) -> None:
        self._last: dict[int, float] = {}
        self._at = time.monotonic()
        self._processes: dict[int, psutil.Process] = {}  # one per pid: no new one per read

    def read(self, pids: Collection[int]) -> float | None:
        now, seconds = time.monotonic(), {}
        kept: dict[int, psutil.Process] = {}
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                process = kept[pid] = self._processes.get(pid) or psutil.Process(pid)
                times = process.cpu_times()
                seconds[pid] = times.user + times.system
        self._processes = kept
        # an engine new since the last read counts from its start: its load is ours too
        spent = sum(total - self._last.get(pid, 0.0) for pid, total in seconds.items())
        elapsed, self._last, self._at = now - self._at, seconds, now
        return None if elapsed <= 0 else 100.0 * spent / elapsed


def held_cores(registry: Registry) -> set[int]:
    """Cores our own engines hold: their use is not other work."""
    return {core for resident in registry for core in resident.cores}


def engine_pids(registry: Registry) -> list[int]:
    return [r.child.pid for r in registry if r.child is not None and r.child.pid is not None]


def rows_of(
    registry: Registry, now: float, host: HostUsage, gpus: list[GpuReading]
) -> list[tuple[Any, ...]]:
    held = registry.held_by_device()
    rows: list[tuple[Any, ...]] = [
        (
            now,
            "host",
            0,
            host.mem_total,
            host.mem_available,
            held.get("host", 0),
            host.cpu_percent,
            host.swap_free,
        )
    ]
    for gpu in gpus:
        device = f"gpu{gpu.index}"
        free = gpu.total - held.get(device, 0) if gpu.simulated else gpu.free
        rows.append(
            (now, device, int(gpu.simulated), gpu.total, free, held.get(device, 0), None, None)
        )
    return rows


def gpu_processes(
    registry: Registry, listed: dict[str, dict[int, int]], gpus: list[GpuReading]
) -> tuple[dict[str, dict[int, int]], set[str]]:
    """Compute processes per GPU, and which GPUs are simulated. NVML lists them on a real GPU
    (``listed``); on a SIMULATED one, fitbox's own children placed there are its processes."""
    found = {device: dict(pids) for device, pids in listed.items()}
    simulated = {f"gpu{g.index}" for g in gpus if g.simulated}
    for resident in registry:
        pid = resident.child.pid if resident.child else None
        for device, size in resident.holdings().items():
            if device in simulated and pid is not None:
                found.setdefault(device, {})[pid] = size
    return found, simulated


def diff_processes(
    before: dict[str, dict[int, int]], after: dict[str, dict[int, int]]
) -> list[tuple[str, int, str, int | None]]:
    """(device, pid, appeared|left, bytes) for every change between two readings."""
    changes: list[tuple[str, int, str, int | None]] = []
    for device in sorted(set(before) | set(after)):
        old, new = before.get(device, {}), after.get(device, {})
        changes += [(device, pid, "appeared", new[pid]) for pid in sorted(set(new) - set(old))]
        changes += [(device, pid, "left", old[pid]) for pid in sorted(set(old) - set(new))]
    return changes


def scout_process(pid: int, device: str, store: Store) -> int:
    """A process on a GPU that fitbox did not start: the model files its command line names,
    recorded as scout findings (models/scout). How many were found."""
    report = scout(pid=pid)
    store.scouted(
        [
            (
                f.path,
                f.name,
                f.bytes,
                f.source,
                f.evidence,
                f"a process fitbox did not start appeared on {device}: {f.led_by}",
                int(f.servable),
                f.detail,
            )
            for f in report.findings
        ]
    )
    return len(report.findings)


@dataclass(frozen=True)
class Reading:
    """One tick's reads of the OS and the GPUs, taken in a thread (``read_tick``)."""

    busy_by_cpu: dict[int, float]
    engines_percent: float | None
    host: HostUsage | None = None
    gpus: list[GpuReading] = field(default_factory=list)
    processes: dict[str, dict[int, int]] = field(default_factory=dict)


def read_tick(
    counter: CoreBusyCounter, engines: EngineCpu, pids: list[int], probe: GpuProbe | None
) -> Reading:
    """The psutil and NVML reads of one tick. ``probe`` None: the CPU only (no store to keep
    the rest)."""
    busy, percent = counter.read(), engines.read(pids)
    if probe is None:
        return Reading(busy, percent)
    return Reading(busy, percent, read_usage(), probe.read(), probe.processes())


async def take_reading(
    counter: CoreBusyCounter, engines: EngineCpu, pids: list[int], probe: GpuProbe | None
) -> Reading:
    """One tick's reads: on the loop where they are all /proc (~155 us of CPU on 2 cores,
    measured), in a thread where NVML asks a driver that can stall (``probe.blocking``).
    A thread hop at each tick cost more than the reads: the pool's wake-up and the
    loop's, each taking the GIL while an engine computes beside fitbox."""
    if probe is not None and probe.blocking:
        return await asyncio.to_thread(read_tick, counter, engines, pids, probe)
    return read_tick(counter, engines, pids, probe)


async def sense(
    config: Config,
    registry: Registry,
    probe: GpuProbe,
    store: Store | None,
    started_pids: set[int],
    busy: BusyCores | None = None,
) -> None:
    """Every ``reading_interval``: what each resident holds now (box/growth.py), which cores
    stay busy with other work (into ``busy``), and, with a store, one reading of memory
    and GPU processes into it (``take_reading``); what they found is applied here, on the
    loop, which owns ``busy`` and the registry.
    ``started_pids``: every engine pid this fitbox started (the supervisor's)."""
    counter, engines = CoreBusyCounter(), EngineCpu()
    read_tick(counter, engines, engine_pids(registry), None)  # /proc only: starts the counters
    if store is not None:
        start_cpu_counter()  # the first reading only starts the CPU counter
    pruned = 0.0
    seen: dict[str, dict[int, int]] = {}
    while True:
        await asyncio.sleep(config.reading_interval)
        await refresh_held_now(registry)
        reading = await take_reading(
            counter, engines, engine_pids(registry), probe if store is not None else None
        )
        if busy is not None:
            busy.observe(reading.busy_by_cpu, held_cores(registry), reading.engines_percent)
        if store is None or reading.host is None:
            continue
        now = time.time()
        store.readings(rows_of(registry, now, reading.host, reading.gpus))
        current, simulated = gpu_processes(registry, reading.processes, reading.gpus)
        for device, pid, change, used in diff_processes(seen, current):
            mine = pid in started_pids  # started by this fitbox, now or before
            store.gpu_process(device, pid, change, used, mine, device in simulated)
            if change == "appeared" and not mine:  # whose weights? (bounded: one process)
                await asyncio.to_thread(scout_process, pid, device, store)
        seen = current
        if now - pruned >= min(PRUNE_EVERY_S, config.reading_retention):
            store.forget_readings(now - config.reading_retention)
            pruned = now
