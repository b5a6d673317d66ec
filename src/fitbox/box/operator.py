"""Operator actions on residents: load, pin, unpin, unload, clear a failed mark."""

from __future__ import annotations

from collections.abc import Iterator

from fitbox.core.types import ResidentState
from fitbox.errors import Conflict, FitboxError, ModelNotServable
from fitbox.models.catalog import Catalog

from .admit import Admission
from .resident import Resident
from .residents import Registry
from .supervision import Supervisor


class Operator:
    def __init__(
        self, catalog: Catalog, registry: Registry, admission: Admission, supervisor: Supervisor
    ) -> None:
        self.catalog, self.registry = catalog, registry
        self.admission, self.supervisor = admission, supervisor

    async def load(self, name: str) -> Resident:
        """Load ``name`` now (or find it loaded) and leave it resident. A model already
        ready is found at once: it needs no call slot, so one busy with calls answers
        without waiting for a slot to free (a pin or load of it never queues behind them)."""
        ready = self._ready(name)
        if ready is not None:
            return ready
        self._check_readable(name)
        lease = await self.admission.acquire(name)
        lease.release()
        return lease.resident

    async def pin(self, name: str, pinned: bool = True) -> Resident:
        """Pin: load if needed and never evict it. Unpin: evictable again."""
        resident = await self.load(name) if pinned else self.resident_named(name)
        self.registry.set_pinned(resident, pinned)
        return resident

    async def unload(self, name: str) -> Resident:
        """Stop ``name`` if it is idle. A model with calls on it is never stopped."""
        resident = self.resident_named(name)
        if resident.calls or resident.state is not ResidentState.READY:
            raise Conflict(
                f"'{resident.artifact.name}' is {resident.state.value} with {resident.calls} "
                "call(s) on it; it is never stopped while serving. Try again when it is idle.",
                param="model",
            )
        self.registry.set_pinned(resident, False)
        await self.supervisor.stop(resident, "operator")
        return resident

    def clear_failed(self, name: str) -> bool:
        artifact = self.catalog.resolve(name)
        keys = {artifact.key} | {r.artifact.key for r in self._copies_of(artifact.name)}
        return any([self.supervisor.crashes.clear(key) for key in keys])

    def _check_readable(self, name: str) -> None:
        """Refuse, with the reason, a load of a model whose file fitbox can no longer read
        (a launch could only fail on it)."""
        try:
            artifact = self.catalog.resolve(name)
        except FitboxError:
            return  # a family or pinned name: admission resolves and refuses it
        problem = self.catalog.problem(artifact.name)
        if problem is not None:
            raise ModelNotServable.because(name, problem, unreadable=True)

    def _ready(self, name: str) -> Resident | None:
        """The ready resident serving ``name`` (a file's name or an alias); None for any
        other name (a family, pins) or a model not ready: those go through admission."""
        try:
            resident = self.resident_named(name)
        except FitboxError:
            return None
        return resident if resident.state is ResidentState.READY else None

    def resident_named(self, name: str) -> Resident:
        """The resident serving ``name``: the file it names, or its copy on another drive
        (the catalog names one copy of a file held twice; the movers load the worker's)."""
        artifact = self.catalog.resolve(name)
        resident = self.registry.get(artifact.key) or next(self._copies_of(artifact.name), None)
        if resident is None:
            raise Conflict(f"'{artifact.name}' is not loaded.", param="model", code="not_resident")
        return resident

    def _copies_of(self, name: str) -> Iterator[Resident]:
        return (r for r in self.registry if r.artifact.name == name)
