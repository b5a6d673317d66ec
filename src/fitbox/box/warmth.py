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


async def unload_idle(box: Box) -> None:
    while True:
        await asyncio.sleep(IDLE_CHECK_EVERY_S)
        async with box._lock:
            expired = idle_expired(box, time.monotonic())
        for resident in [r for r in box.residents() if r.key in expired]:
            log.info("%s idle past its TTL: unloading", resident.artifact.name)
            await box._stop(resident)
            if box.store is not None:
                box.store.operator_action("idle-unload", resident.artifact.name, "fitbox",
                                          None, "ok")  # fmt: skip
