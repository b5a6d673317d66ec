"""The hang watchdog: a call's wait on its engine, bounded by the engine's own liveness.

After ``engine_idle_timeout`` seconds without a result, the engine's health is probed: an
engine that answers is busy (a long prompt, a long silent generation) and is waited for
again; one that does not is hung: the supervisor restarts it and the call ends with
``engine_timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from fitbox.engines.http1 import EngineConnectionError
from fitbox.errors import EngineTimeout

from ..resident import Resident
from .supervisor import Supervisor

T = TypeVar("T")
HEALTH_PROBE_S = 5.0  # how long a hung-looking engine gets to answer /health


class Watchdog:
    def __init__(self, supervisor: Supervisor, idle_timeout: float) -> None:
        self.supervisor = supervisor
        self.idle_timeout = idle_timeout

    async def watched(self, resident: Resident, awaitable: Awaitable[T]) -> T:
        """Await the engine on behalf of one call on ``resident``."""
        task = asyncio.ensure_future(awaitable)
        idle = self.idle_timeout
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=idle)
                if done:
                    return task.result()
                if await self._answers_health(resident, min(HEALTH_PROBE_S, idle)):
                    continue
                await self.supervisor.hung(resident, idle)
                raise EngineTimeout(
                    f"{resident.engine.name} serving '{resident.artifact.name}' sent nothing "
                    f"for {idle:.0f} s and did not answer its health probe; it was restarted. "
                    "Retry the call.",
                    log_tail=resident.child.tail() if resident.child else [],
                )  # fmt: skip
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    async def _answers_health(self, resident: Resident, limit: float) -> bool:
        if resident.child is None:
            return False
        try:
            status, _ = await asyncio.wait_for(resident.child.pool.get("/health"), limit)
        except (TimeoutError, EngineConnectionError, OSError):
            return False
        return status == 200
