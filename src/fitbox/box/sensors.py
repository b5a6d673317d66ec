"""Sensor readings: host RAM, swap and CPU, and each GPU's memory, every
``reading_interval`` seconds into ``resource_log`` (store/db.py ``readings``: no event, so
the change counter stays still), pruned to ``reading_retention``; which cores stay busy
with other work, for claims (``BusyCores``; FORMULAS.md §CPU claims). A process that
appears on a GPU and that fitbox did not start is scouted: which model files it runs on."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection, Mapping
from typing import Any

from fitbox.config import Config
from fitbox.models.scout import scout
from fitbox.probe.gpus import GpuProbe, GpuReading
from fitbox.probe.host import CoreBusyCounter, read_usage, start_cpu_counter
from fitbox.store.db import Store

from .growth import refresh_held_now
from .residents import Registry

PRUNE_EVERY_S = 60.0


class BusyCores:
    """Physical cores busy with other work: a core none of fitbox's engines holds whose
    busiest logical CPU read at least ``percent`` busy for ``readings`` readings in a row.
    One reading below, or one of our engines taking the core, clears it. Owned by the
    sensor loop (``observe``); claims read ``busy()``."""

    def __init__(self, cores: Mapping[int, frozenset[int]], percent: float, readings: int) -> None:
        self.cores, self.percent, self.readings = dict(cores), percent, readings
        self._streak = dict.fromkeys(self.cores, 0)

    def observe(self, busy_by_cpu: Mapping[int, float], held: Collection[int]) -> None:
        for core, cpus in self.cores.items():
            level = max((busy_by_cpu.get(cpu, 0.0) for cpu in cpus), default=0.0)
            sustained = core not in held and level >= self.percent
            self._streak[core] = self._streak[core] + 1 if sustained else 0

    def busy(self) -> tuple[int, ...]:
        return tuple(sorted(c for c, n in self._streak.items() if n >= self.readings))


def held_cores(registry: Registry) -> set[int]:
    """Cores our own engines hold: their use is not other work."""
    return {core for resident in registry for core in resident.cores}


def read_all(registry: Registry, now: float, gpus: list[GpuReading]) -> list[tuple[Any, ...]]:
    held = registry.held_by_device()
    host = read_usage()
    rows: list[tuple[Any, ...]] = [
        (now, "host", 0, host.mem_total, host.mem_available, held.get("host", 0),
         host.cpu_percent, host.swap_free)
    ]
    for gpu in gpus:
        device = f"gpu{gpu.index}"
        free = gpu.total - held.get(device, 0) if gpu.simulated else gpu.free
        rows.append((now, device, int(gpu.simulated), gpu.total, free, held.get(device, 0),
                     None, None))  # fmt: skip
    return rows


def gpu_processes(
    registry: Registry, probe: GpuProbe, gpus: list[GpuReading]
) -> tuple[dict[str, dict[int, int]], set[str]]:
    """Compute processes per GPU, and which GPUs are simulated. NVML lists them on a real GPU;
    on a SIMULATED one, fitbox's own children placed there are its processes."""
    found = probe.processes()
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
    store.scouted([(f.path, f.name, f.bytes, f.source, f.evidence,
                    f"a process fitbox did not start appeared on {device}: {f.led_by}",
                    int(f.servable), f.detail) for f in report.findings])  # fmt: skip
    return len(report.findings)


async def sense(
    config: Config, registry: Registry, probe: GpuProbe, store: Store | None,
    started_pids: set[int], busy: BusyCores | None = None,
) -> None:  # fmt: skip
    """Every ``reading_interval``: what each resident holds now (box/growth.py), which cores
    stay busy with other work (into ``busy``), and, with a store, one reading of memory
    and GPU processes into it.
    ``started_pids``: every engine pid this fitbox started (the supervisor's)."""
    counter = CoreBusyCounter()
    counter.read()  # the first reading only starts the counter
    if store is None:
        while True:
            await asyncio.sleep(config.reading_interval)
            await refresh_held_now(registry)
            if busy is not None:
                busy.observe(counter.read(), held_cores(registry))
    start_cpu_counter()  # the first reading only starts the CPU counter
    pruned = 0.0
    seen: dict[str, dict[int, int]] = {}
    while True:
        await asyncio.sleep(config.reading_interval)
        await refresh_held_now(registry)
        if busy is not None:
            busy.observe(counter.read(), held_cores(registry))
        now = time.time()
        gpus = probe.read()  # one NVML reading serves memory and processes
        store.readings(read_all(registry, now, gpus))
        current, simulated = gpu_processes(registry, probe, gpus)
        for device, pid, change, used in diff_processes(seen, current):
            mine = pid in started_pids  # started by this fitbox, now or before
            store.gpu_process(device, pid, change, used, mine, device in simulated)
            if change == "appeared" and not mine:  # whose weights? (bounded: one process)
                await asyncio.to_thread(scout_process, pid, device, store)
        seen = current
        if now - pruned >= min(PRUNE_EVERY_S, config.reading_retention):
            store.forget_readings(now - config.reading_retention)
            pruned = now
