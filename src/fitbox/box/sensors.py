"""Sensor readings: host RAM, swap and CPU, and each GPU's memory, every
``reading_interval`` seconds into ``resource_log`` (store/db.py ``readings``: no event, so
the change counter stays still), pruned to ``reading_retention``."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import psutil

if TYPE_CHECKING:
    from .box import Box

PRUNE_EVERY_S = 60.0


def read_all(box: Box, now: float) -> list[tuple[Any, ...]]:
    held: dict[str, int] = {}
    for resident in box.residents():
        for device, size in resident.holdings().items():
            held[device] = held.get(device, 0) + size
    memory, swap = psutil.virtual_memory(), psutil.swap_memory()
    cpu = psutil.cpu_percent(None)
    rows: list[tuple[Any, ...]] = [
        (now, "host", 0, memory.total, memory.available, held.get("host", 0), cpu, swap.free)
    ]
    for gpu in box.gpus.read():
        device = f"gpu{gpu.index}"
        free = gpu.total - held.get(device, 0) if gpu.simulated else gpu.free
        rows.append((now, device, int(gpu.simulated), gpu.total, free, held.get(device, 0),
                     None, None))  # fmt: skip
    return rows


async def sense(box: Box) -> None:
    if box.store is None:
        return
    psutil.cpu_percent(None)  # the first call only starts the CPU counter
    pruned = 0.0
    while True:
        await asyncio.sleep(box.config.reading_interval)
        now = time.time()
        box.store.readings(read_all(box, now))
        if now - pruned >= min(PRUNE_EVERY_S, box.config.reading_retention):
            box.store.forget_readings(now - box.config.reading_retention)
            pruned = now
