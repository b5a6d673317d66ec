"""The hang watchdog: a call's wait on its engine, bounded by the *engine's* liveness, never by
one call's silence.

A call can wait long with no byte of its own while its engine works: queued for a slot
behind other calls (llama-server takes ``-np`` at once and queues the rest), or behind a
long prompt. So the watchdog asks about the engine, in this order, and the first witness
that says "working" lets the call wait on:

1. progress: a byte to *any* of the resident's calls within ``idle_timeout`` (every watched
   wait that ends stamps ``Resident.progress_at``);
2. ``/health`` answered within ``min(HEALTH_PROBE_S, idle_timeout)``;
3. CPU time: the engine's processes ran for ``CPU_WORKING_S`` or more during that probe
   (llama-server under load can leave ``/health`` unanswered for seconds while it works).

Only an engine with no progress for ``idle_timeout``, a silent ``/health`` and no CPU time
is hung: the supervisor stops it (once, however many calls found it so) and the call ends
with ``engine_timeout``. An engine that spins its CPU while answering nothing is taken as
working; the client's own timeout bounds that call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from typing import TypeVar

import psutil

from fitbox.engines.http1 import EngineConnectionError
from fitbox.errors import EngineTimeout

from ..resident import Resident
from .supervisor import Supervisor

log = logging.getLogger(__name__)
T = TypeVar("T")
HEALTH_PROBE_S = 5.0  # how long a quiet engine gets to answer /health
CPU_WORKING_S = 0.05  # CPU seconds during the probe that say it works (a stopped one: 0)


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU time of a process and everything it forked; None: it is gone."""
    if pid is None:
        return None
    try:
        process = psutil.Process(pid)
        total = 0.0
        for p in (process, *process.children(recursive=True)):
            with contextlib.suppress(psutil.Error):
                times = p.cpu_times()
                total += times.user + times.system
    except psutil.Error:
        return None
    return total


class Watchdog:
    def __init__(self, supervisor: Supervisor, idle_timeout: float) -> None:
        self.supervisor = supervisor
        self.idle_timeout = idle_timeout

    async def watched(self, resident: Resident, awaitable: Awaitable[T]) -> T:
        """Await the engine on behalf of one call on ``resident``."""
        task = asyncio.ensure_future(awaitable)
        idle, wait, told = self.idle_timeout, self.idle_timeout, False
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=wait)
                if done:
                    resident.progress_at = time.monotonic()
                    return task.result()
                quiet = time.monotonic() - resident.progress_at
                if quiet < idle:  # bytes to another call: look again when the engine is quiet
                    wait = idle - quiet
                    if not told:
                        told = True
                        log.info("%s serving '%s': a call has had no byte for %.0f s while "
                                 "the engine works for its other calls (queued for a slot); "
                                 "waiting on", resident.engine.name, resident.artifact.name,
                                 idle)  # fmt: skip
                    continue
                wait = idle
                if await self._working(resident, min(HEALTH_PROBE_S, idle)):
                    continue
                await self.supervisor.hung(resident, idle)
                raise EngineTimeout(
                    f"{resident.engine.name} serving '{resident.artifact.name}' sent nothing "
                    f"for {idle:.0f} s and did not answer its health probe (nor used any CPU); "
                    "it was restarted. Retry the call.",
                    log_tail=resident.child.tail() if resident.child else [],
                )  # fmt: skip
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            elif not task.cancelled():
                # it ended in the turn this call was cancelled (a stream's last anext() and
                # the client's disconnect): read its outcome, or asyncio reports it unread
                task.exception()

    async def _working(self, resident: Resident, limit: float) -> bool:
        """Whether a quiet engine answers /health, or else ran on the CPU meanwhile."""
        child = resident.child
        if child is None:
            return False
        before = cpu_seconds(child.pid)
        with contextlib.suppress(TimeoutError, EngineConnectionError, OSError):
            async with asyncio.timeout(limit):  # not wait_for: on 3.11 it can swallow a cancel
                status, _ = await child.pool.get("/health")
            if status == 200:
                return True
        after = cpu_seconds(child.pid)
        if before is None or after is None or after - before < CPU_WORKING_S:
            return False
        log.warning("%s serving '%s' did not answer /health within %.0f s but ran %.2f s on "
                    "the CPU meanwhile: busy, not hung", resident.engine.name,
                    resident.artifact.name, limit, after - before)  # fmt: skip
        return True
