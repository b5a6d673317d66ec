"""Warm and cold: models loaded at start (preload, pinned), idle ones unloaded after their
idle TTL, ones loaded below their preferred window rebuilt once room has lasted, and ones
launched on fewer threads than a claim now gives started again once the cores stayed free.
All follow the operator's knobs (box/preferences.py)."""

from __future__ import annotations

import asyncio
import logging
import time

from fitbox.config import Config
from fitbox.core.evict import over_caps
from fitbox.core.types import ResidentState
from fitbox.errors import FitboxError
from fitbox.units import format_bytes

from .admit import Admission
from .asks import Asks
from .operator import Operator
from .resident import Resident
from .residents import Registry
from .supervision import Supervisor

log = logging.getLogger(__name__)
S = ResidentState
IDLE_CHECK_EVERY_S = 1.0
ROOM_CHECKS = 3  # consecutive checks that must find room before a rebuild: sustained room


class Warmth:
    def __init__(
        self,
        config: Config,
        registry: Registry,
        asks: Asks,
        admission: Admission,
        supervisor: Supervisor,
        operator: Operator,
    ) -> None:
        self.config, self.registry, self.asks = config, registry, asks
        self.admission, self.supervisor, self.operator = admission, supervisor, operator
        self.cap_problems: list[str] = []  # what a lowered cap cannot evict yet (/health)
        # caps are enforced on residents only after a change of limits, until all fit: a
        # resident whose measured bytes outgrew a cap it was placed under stays (its next
        # placement is priced on them)
        self._enforcing = False

    def limits_changed(self) -> None:
        self._enforcing = True

    async def warm_up(self) -> None:
        """Load every model marked preload or pinned, one at a time (each may evict)."""
        for model, knobs in list(self.asks.prefs.pairs.items()):
            if not (knobs.get("preload") or knobs.get("pinned")):
                continue
            try:
                if knobs.get("pinned"):
                    await self.operator.pin(model)
                else:
                    await self.operator.load(model)
                log.info(
                    "%s loaded at start (%s)", model, "pinned" if knobs.get("pinned") else "preload"
                )
            except FitboxError as exc:
                log.warning("could not load %s at start: %s", model, exc.message)

    def idle_expired(self, now: float) -> list[Resident]:
        """Residents idle past their TTL, marked stopping (so no call joins them)."""
        expired = []
        for resident in self.registry:
            if resident.state is not S.READY or resident.calls or resident.pinned:
                continue
            ttl = float(self.asks.settings_for(resident.asked, [resident.artifact])["idle_ttl"])
            if ttl > 0 and now - resident.last_used >= ttl:
                self.registry.move(resident, S.STOPPING)
                expired.append(resident)
        return expired

    def to_grow(self) -> list[tuple[Resident, int]]:
        """Residents loaded below the window they would get now, idle, with demand (calls
        since the load), past the cooldown, and room found on ``ROOM_CHECKS`` checks in a
        row; they are marked stopping. Each with the window it would get."""
        grow = []
        for resident in self.registry:
            loaded_for = time.time() - resident.ready_at if resident.ready_at else 0.0
            busy = resident.state is not S.READY or resident.calls or resident.pinned
            if busy or not resident.served or loaded_for < self.config.grow_cooldown:
                resident.room_seen = 0
                continue
            window = self.admission.larger_window(resident)
            resident.room_seen = resident.room_seen + 1 if window else 0
            if window and resident.room_seen >= ROOM_CHECKS:
                self.registry.move(resident, S.STOPPING)
                grow.append((resident, window))
        return grow

    def widen_idle(self) -> int:
        """Under the lock: idle residents with demand (calls since the load), idle at least as
        long as their load took, whose claim now would hold more cores than their threads,
        on ``ROOM_CHECKS`` checks in a row, start again on those cores (box/admit.py
        ``widen``). How many did."""
        widened, now = 0, time.monotonic()
        for resident in list(self.registry):
            # idle at least as long as its load took: a call that comes while it loads again
            # waits that long (a transformers child loads in ~30 s, SmolLM2 in ~0.3 s)
            recent = now - resident.last_used < (resident.load_seconds or 0.0)
            busy = resident.state is not S.READY or resident.calls or recent
            cores = None if busy or not resident.served else self.admission.wider_claim(resident)
            resident.cores_seen = resident.cores_seen + 1 if cores else 0
            if cores and resident.cores_seen >= ROOM_CHECKS:
                self.admission.widen(resident, cores)
                widened += 1
        return widened

    def settings_changed(self) -> int:
        """Under the lock: idle residents whose settings now give another launch are loaded
        again (box/launches.py), so a setting takes effect without a call or an unload.
        How many were."""
        return sum(self.admission.settings_changed(r) for r in list(self.registry))

    def over_caps(self) -> list[Resident]:
        """Under the lock: idle residents that leave because a cap was lowered below what
        the residents hold (``/v1/limits``, a central's allotment), marked stopping; what
        those cannot free (residents serving, loading or pinned: never stopped for it) is
        kept in ``cap_problems`` until it fits."""
        if not self._enforcing:
            return []
        prefs = self.asks.prefs
        staying = [r for r in self.registry if r.state is not S.STOPPING]
        ram, vram = prefs.cap("ram_max"), prefs.cap("vram_max")
        caps = {} if ram is None else {"host": int(ram)}
        if vram is not None:
            caps |= {d: int(vram) for r in staying for d in r.holdings() if d != "host"}
        views = {r.key: r for r in staying}
        leaving, still = over_caps(caps, [r.view() for r in staying])
        found = [views[v.key] for v in leaving]
        for resident in found:
            self.registry.move(resident, S.STOPPING)
        self._enforcing = bool(still)
        self.cap_problems = [
            self._over(device, caps[device], bytes_over, [r for r in staying if r not in found])
            for device, bytes_over in still.items()
        ]
        return found

    @staticmethod
    def _over(device: str, cap: int, bytes_over: int, kept: list[Resident]) -> str:
        held = [
            f"{r.artifact.name} ({'pinned' if r.pinned else r.state.value}"
            f"{f', {r.calls} call(s)' if r.calls else ''})"
            for r in kept
            if r.holdings().get(device)
        ]
        setting = "ram_max" if device == "host" else "vram_max"
        return (
            f"{device}: the residents hold {format_bytes(bytes_over)} more than its "
            f"{format_bytes(cap)} cap ({setting}), held by {', '.join(held)}; a serving or "
            "loading one leaves once idle, a pinned one only when unpinned or the cap is raised"
        )

    async def unload_idle(self) -> None:
        while True:
            await asyncio.sleep(IDLE_CHECK_EVERY_S)
            async with self.registry.lock:
                lowered = self.over_caps()
                expired = self.idle_expired(time.monotonic())
                grow = self.to_grow()
                self.widen_idle()
                self.settings_changed()
            for resident, window in grow:
                log.info(
                    "%s: room for a %d-token window has lasted; rebuilding it (was %d)",
                    resident.artifact.name,
                    window,
                    resident.window,
                )
                await self.supervisor.stop(resident, "grow_back")
                try:
                    await self.operator.load(resident.asked or resident.artifact.name)
                except FitboxError as exc:
                    log.warning("rebuilding %s failed: %s", resident.artifact.name, exc.message)
            for resident in expired:
                log.info("%s idle past its TTL: unloading", resident.artifact.name)
                await self.supervisor.stop(resident, "idle_ttl")
            for resident in lowered:
                log.info("%s: a lowered cap no longer holds it; unloading", resident.artifact.name)
                await self.supervisor.stop(resident, "cap_lowered")
