"""Warm and cold: models loaded at start (preload, pinned), and idle ones unloaded after
their idle TTL. Both follow the operator's knobs (box/preferences.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from fitbox.core.types import ResidentState
from fitbox.errors import FitboxError

if TYPE_CHECKING:
    from .box import Box

log = logging.getLogger(__name__)
IDLE_CHECK_EVERY_S = 1.0
ROOM_CHECKS = 3  # consecutive checks that must find room before a rebuild: sustained room


async def warm_up(box: Box) -> None:
    """Load every model marked preload or pinned, one at a time (each may evict)."""
    for model, knobs in list(box.prefs.pairs.items()):
        if not (knobs.get("preload") or knobs.get("pinned")):
            continue
        try:
            if knobs.get("pinned"):
                await box.pin(model)
            else:
                await box.load(model)
            log.info("%s loaded at start (%s)", model, "pinned" if knobs.get("pinned")
                     else "preload")  # fmt: skip
        except FitboxError as exc:
            log.warning("could not load %s at start: %s", model, exc.message)


def idle_expired(box: Box, now: float) -> list[str]:
    """Residents idle past their TTL, marked stopping (so no call joins them); their keys."""
    expired = []
    for resident in box.residents():
        if resident.state is not ResidentState.READY or resident.calls or resident.pinned:
            continue
        ttl = float(box.settings_for(resident.asked, [resident.artifact])["idle_ttl"])
        if ttl > 0 and now - resident.last_used >= ttl:
            resident.state = ResidentState.STOPPING
            expired.append(resident.key)
    return expired


def to_grow(box: Box, now: float) -> list[tuple[str, int]]:
    """Residents loaded below the window they would get now, idle, with demand (calls since
    the load), past the cooldown, and room found on ``ROOM_CHECKS`` checks in a row; they are
    marked stopping. (asked name, window) of each."""
    grow = []
    for resident in box.residents():
        loaded_for = time.time() - resident.ready_at if resident.ready_at else 0.0
        busy = resident.state is not ResidentState.READY or resident.calls or resident.pinned
        if busy or not resident.served or loaded_for < box.config.grow_cooldown:
            resident.room_seen = 0
            continue
        window = box.larger_window(resident)
        resident.room_seen = resident.room_seen + 1 if window else 0
        if window and resident.room_seen >= ROOM_CHECKS:
            resident.state = ResidentState.STOPPING
            grow.append((resident.asked or resident.artifact.name, window))
    return grow


async def unload_idle(box: Box) -> None:
    while True:
        await asyncio.sleep(IDLE_CHECK_EVERY_S)
        async with box._lock:
            now = time.monotonic()
            expired = idle_expired(box, now)
            grow = to_grow(box, now)
        for name, window in grow:
            resident = next(r for r in box.residents() if (r.asked or r.artifact.name) == name
                            and r.state is ResidentState.STOPPING)  # fmt: skip
            log.info("%s: room for a %d-token window has lasted; rebuilding it (was %d)",
                     resident.artifact.name, window, resident.window)  # fmt: skip
            await box._stop(resident, "grow_back")
            try:
                await box.load(name)
            except FitboxError as exc:
                log.warning("rebuilding %s failed: %s", name, exc.message)
        for resident in [r for r in box.residents() if r.key in expired]:
            log.info("%s idle past its TTL: unloading", resident.artifact.name)
            await box._stop(resident, "idle_ttl")
