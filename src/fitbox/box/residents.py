"""The resident registry: residents by artifact key, the placement lock, the change signal.

It is the only code that changes a resident's state, and only along ``TRANSITIONS``:

    starting ─▶ ready | stopping | failed   (loaded; stopped while loading; load failed)
    ready    ─▶ stopping | failed            (evicted, unloaded, hung; exited on its own)
    stopping ─▶ stopped                      (stopped and failed are final)

A resident leaves the registry when it reaches ``stopped`` or ``failed``; every change
wakes whoever waits for room (``notify``). Calls join and release residents here too, so
the count that says "never evict, never reload" has one writer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

from fitbox.core.types import ResidentState

from .resident import Resident

S = ResidentState
TRANSITIONS: dict[ResidentState, frozenset[ResidentState]] = {
    S.STARTING: frozenset({S.READY, S.STOPPING, S.FAILED}),
    S.READY: frozenset({S.STOPPING, S.FAILED}),
    S.STOPPING: frozenset({S.STOPPED}),
    S.STOPPED: frozenset(),
    S.FAILED: frozenset(),
}
GONE = frozenset({S.STOPPED, S.FAILED})


class IllegalTransition(RuntimeError):
    pass


class Registry:
    def __init__(self) -> None:
        self._residents: dict[str, Resident] = {}
        self.lock = asyncio.Lock()  # covers placement decisions, never a load
        self._changed = asyncio.Event()

    # -- reading -------------------------------------------------------------------

    def __iter__(self) -> Iterator[Resident]:
        return iter(list(self._residents.values()))

    def __len__(self) -> int:
        return len(self._residents)

    def __contains__(self, key: object) -> bool:
        return key in self._residents

    def get(self, key: str) -> Resident | None:
        return self._residents.get(key)

    def holds(self, resident: Resident) -> bool:
        """Whether ``resident`` is still the one registered for its file."""
        return self._residents.get(resident.key) is resident

    def held_by_device(self) -> dict[str, int]:
        """Bytes every resident holds, summed per device."""
        held: dict[str, int] = {}
        for resident in self._residents.values():
            for device, size in resident.holdings().items():
                held[device] = held.get(device, 0) + size
        return held

    def in_use_by_device(self) -> dict[str, int]:
        """Bytes every resident shows as taken in a free-memory reading, per device."""
        used: dict[str, int] = {}
        for resident in self._residents.values():
            for device, size in resident.in_use().items():
                used[device] = used.get(device, 0) + size
        return used

    # -- changing ------------------------------------------------------------------

    def add(self, resident: Resident) -> None:
        """Register a new resident (``starting``); its bytes count as reserved from now."""
        if resident.key in self._residents:
            raise IllegalTransition(f"{resident.artifact.name} is already resident")
        self._residents[resident.key] = resident
        self.notify()

    def move(self, resident: Resident, state: ResidentState) -> None:
        """The one way a resident's state changes; an illegal transition raises."""
        if state not in TRANSITIONS[resident.state]:
            raise IllegalTransition(
                f"{resident.artifact.name}: {resident.state.value} -> {state.value}"
            )
        resident._state = state
        if state in GONE and self.holds(resident):
            del self._residents[resident.key]
        self.notify()

    def join(self, resident: Resident, slots: int = 1, cells: int = 0) -> None:
        """A call starts on ``resident`` and takes ``slots`` of its slots (its ``n``) and
        ``cells`` of its shared pool: it is now serving."""
        resident.calls += 1
        resident.slots_taken += slots
        resident.cells_taken += cells
        resident.served += 1
        resident.last_used = time.monotonic()

    def release(self, resident: Resident, slots: int = 1, cells: int = 0) -> None:
        """A call on ``resident`` ended, giving back its slots and cells; waiting calls may
        find room, or it idle, now."""
        resident.calls -= 1
        resident.slots_taken -= slots
        resident.cells_taken -= cells
        resident.last_used = time.monotonic()
        self.notify()

    def set_pinned(self, resident: Resident, pinned: bool) -> None:
        resident.pinned = pinned
        self.notify()

    # -- waiting -------------------------------------------------------------------

    def change(self) -> asyncio.Event:
        """The event the next change sets; take it under the lock, wait outside it."""
        return self._changed

    def notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
