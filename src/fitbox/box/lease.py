"""A call's hold on a ready resident: while it is held, the resident is serving and is never
evicted or reloaded. ``release()`` once the call is done (twice is harmless)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from fitbox.core.ask import Speeds
from fitbox.engines.http1 import EnginePool

from .resident import Resident
from .residents import Registry


@dataclass(eq=False)
class Lease:
    resident: Resident
    registry: Registry
    evicted: list[str] = field(default_factory=list)
    loaded: bool = False  # this call's placement loaded the model
    slots: int = 1  # the resident's slots this call holds (its ``n``)
    cells: int = 0  # the cells of its shared pool this call holds (core/slots.py Demand)
    _released: bool = False

    @property
    def pool(self) -> EnginePool:
        assert self.resident.child is not None
        return self.resident.child.pool

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.resident.expected_ends.pop(id(self), None)
            self.registry.release(self.resident, self.slots, self.cells)

    def expect(self, speeds: Speeds, prompt_tokens: int, max_tokens: int) -> None:
        """When this call should be done, from the model's measured rates (None: unknown)."""
        seconds = None
        if speeds.decode_ms is not None and speeds.prompt_ms is not None and max_tokens:
            seconds = (prompt_tokens * speeds.prompt_ms + max_tokens * speeds.decode_ms) / 1000
        self.expect_in(seconds)

    def expect_in(self, seconds: float | None) -> None:
        """This call should be done in ``seconds`` (None: unknown): a task call's work at
        its model's measured units per second (box/task_speeds.py)."""
        self.resident.expected_ends[id(self)] = (
            None if seconds is None else time.monotonic() + seconds
        )
