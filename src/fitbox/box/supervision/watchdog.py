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
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
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
        """Await the engine on behalf of one call on ``resident``. The wait runs in the
        call's own task, guarded by a timer that looks at the engine only once the wait has
        lasted ``idle_timeout`` (a task and an ``asyncio.wait`` per await cost ~0.13 ms, and
        a stream awaits once a chunk)."""
        guard = _Guard(self, resident)
        try:
            result = await awaitable
        except BaseException as exc:
            guard.ended = True
            if guard.condemned is None:
                raise
            if isinstance(exc, asyncio.CancelledError) and not guard.ours():
                raise  # the client left (or fitbox stops) as well: that cancel goes on
            await guard.stopped()  # the engine's stop is under way: the call ends with it
            raise guard.condemned from None
        finally:
            guard.ended = True
            guard.close()
        if guard.condemned is not None:  # found hung as its answer came: it is being stopped
            await guard.stopped()
            raise guard.condemned from None
        resident.progress_at = time.monotonic()
        return result

    async def stream(self, resident: Resident, pieces: AsyncIterator[T]) -> AsyncGenerator[T, None]:
        """``pieces`` (an engine's streamed reply) awaited on behalf of one call as
        :meth:`watched` awaits one thing: one guard for the whole stream, whose timer, when
        it fires, looks again from the start of the wait under way (a timer per piece cost
        ~4.5 us of fitbox's CPU per streamed token). While the caller holds a piece (a slow
        client) nothing of the engine is judged. Close it (``contextlib.aclosing``)."""
        guard = _Guard(self, resident)
        try:
            while True:
                if guard.condemned is not None:  # found hung while the caller held a piece
                    await guard.stopped()
                    raise guard.condemned from None
                guard.began, guard.waiting = time.monotonic(), True
                try:
                    piece = await anext(pieces)
                except StopAsyncIteration:
                    return
                except BaseException as exc:
                    guard.ended = True
                    if guard.condemned is None:
                        raise
                    if isinstance(exc, asyncio.CancelledError) and not guard.ours():
                        raise
                    await guard.stopped()
                    raise guard.condemned from None
                guard.waiting = False
                if guard.condemned is not None:  # found hung as its answer came
                    await guard.stopped()
                    raise guard.condemned from None
                resident.progress_at = time.monotonic()
                yield piece
        finally:
            guard.ended = True
            guard.close()

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
        log.warning(
            "%s serving '%s' did not answer /health within %.0f s but ran %.2f s on "
            "the CPU meanwhile: busy, not hung",
            resident.engine.name,
            resident.artifact.name,
            limit,
            after - before,
        )
        return True


class _Guard:
    """One watched wait's timer, and the probe it starts when the wait goes quiet: when the
    engine is found hung, the probe stops it, then cancels the waiting call's task, which
    ends with ``condemned`` (an ``engine_timeout``)."""

    def __init__(self, dog: Watchdog, resident: Resident) -> None:
        self.dog, self.resident = dog, resident
        self.task = asyncio.current_task()
        self.loop = asyncio.get_running_loop()
        self.condemned: EngineTimeout | None = None  # set once the engine was found hung
        self.cancelled = False  # this guard cancelled the call's task
        self.ended = False  # the wait is over: the call's task is no longer this guard's
        self.told = False
        self.probe: asyncio.Task[None] | None = None
        # a stream's guard (Watchdog.stream) serves many waits: when the one under way began,
        # and whether one is under way (not while the caller holds a piece)
        self.began = time.monotonic()
        self.waiting = True
        self.timer = self.loop.call_later(dog.idle_timeout, self._quiet)

    def _quiet(self) -> None:
        idle = self.dog.idle_timeout
        now = time.monotonic()
        waited = now - self.began
        if not self.waiting or waited < idle:  # a stream's later wait: look again in time
            self.timer = self.loop.call_later(idle - waited if self.waiting else idle, self._quiet)
            return
        quiet = now - self.resident.progress_at
        if quiet < idle:  # bytes to another call: look again when the engine is quiet
            if not self.told:
                self.told = True
                log.info(
                    "%s serving '%s': a call has had no byte for %.0f s while the engine "
                    "works for its other calls (queued for a slot); waiting on",
                    self.resident.engine.name,
                    self.resident.artifact.name,
                    idle,
                )
            self.timer = self.loop.call_later(idle - quiet, self._quiet)
            return
        self.probe = self.loop.create_task(self._probe())

    async def _probe(self) -> None:
        dog, resident, idle = self.dog, self.resident, self.dog.idle_timeout
        if await dog._working(resident, min(HEALTH_PROBE_S, idle)):
            self.timer = self.loop.call_later(idle, self._quiet)
            return
        self.condemned = EngineTimeout(
            f"{resident.engine.name} serving '{resident.artifact.name}' sent nothing "
            f"for {idle:.0f} s and did not answer its health probe (nor used any CPU); "
            "it was restarted. Retry the call.",
            log_tail=resident.child.tail() if resident.child else [],
        )
        await dog.supervisor.hung(resident, idle)
        if self.task is not None and not self.ended and self.waiting:
            self.cancelled = True
            self.task.cancel()

    def ours(self) -> bool:
        """Whether the cancel the call's task got is this guard's alone (then taken back)."""
        return self.cancelled and self.task is not None and self.task.uncancel() == 0

    async def stopped(self) -> None:
        """Wait for the hung engine's stop, when the wait ended before the probe cancelled it
        (the engine's connection broke as it was stopped)."""
        if self.probe is not None and not self.probe.done():
            with contextlib.suppress(BaseException):
                await asyncio.shield(self.probe)

    def close(self) -> None:
        self.timer.cancel()
        if self.probe is not None and not self.probe.done() and self.condemned is None:
            self.probe.cancel()  # the wait ended while the engine was being looked at
