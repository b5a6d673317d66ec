"""A call's hold on a ready resident, and the watchdog on the engine while it is held."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from fitbox.engines.http1 import EngineConnectionError, EnginePool
from fitbox.errors import EngineTimeout

from .resident import Resident

if TYPE_CHECKING:
    from .box import Box

T = TypeVar("T")
HEALTH_PROBE_S = 5.0  # how long a hung-looking engine gets to answer /health


@dataclass
class Lease:
    """A call's hold on a ready resident. ``release()`` once the call is done."""

    resident: Resident
    box: Box
    evicted: list[str] = field(default_factory=list)
    loaded: bool = False
    _released: bool = False

    @property
    def engine(self) -> EnginePool:
        assert self.resident.child is not None
        return self.resident.child.pool

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.resident.expected_ends.pop(id(self), None)
            self.box._release(self.resident)

    def expect(self, prompt_tokens: int, max_tokens: int) -> None:
        """When this call should be done, from the model's measured rates (None: unknown)."""
        speeds = self.box.speeds.of(self.resident.artifact, self.resident.rung.value)
        seconds = None
        if speeds.decode_ms is not None and speeds.prompt_ms is not None and max_tokens:
            seconds = (prompt_tokens * speeds.prompt_ms + max_tokens * speeds.decode_ms) / 1000
        self.resident.expected_ends[id(self)] = (
            None if seconds is None else time.monotonic() + seconds
        )

    async def watched(self, awaitable: Awaitable[T]) -> T:
        """Await the engine; after ``engine_idle_timeout`` seconds without a result, probe its
        health: an engine that answers is busy (a long prompt, a long silent generation) and
        is waited for again; one that does not is hung: it is restarted and the call ends
        with ``engine_timeout``."""
        task = asyncio.ensure_future(awaitable)
        idle = self.box.config.engine_idle_timeout
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=idle)
                if done:
                    return task.result()
                if await self._answers_health(min(HEALTH_PROBE_S, idle)):
                    continue
                await self.box.engine_hung(self.resident, idle)
                raise EngineTimeout(
                    f"llama-server serving '{self.resident.artifact.name}' sent nothing for "
                    f"{idle:.0f} s and did not answer its health probe; it was restarted. "
                    "Retry the call.",
                    log_tail=self.resident.child.tail() if self.resident.child else [],
                )  # fmt: skip
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    async def _answers_health(self, limit: float) -> bool:
        try:
            status, _ = await asyncio.wait_for(self.engine.get("/health"), timeout=limit)
        except (TimeoutError, EngineConnectionError, OSError):
            return False
        return status == 200
