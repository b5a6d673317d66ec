"""A resident: one loaded (or loading, or leaving) engine child and what it holds.

Its ``state`` is read here and changed only by the registry (box/residents.py), through
its transition table.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from fitbox.core.decision import Place
from fitbox.core.slots import Demand, Slots, admits
from fitbox.core.types import Footprint, ResidentState, ResidentView, Rung
from fitbox.engines.child import Child
from fitbox.engines.seam import Engine
from fitbox.models.catalog import Artifact


def _quiet_future() -> asyncio.Future[None]:
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    # a load that fails with nobody waiting must not warn "exception never retrieved"
    future.add_done_callback(lambda f: f.cancelled() or f.exception())
    return future


@dataclass(eq=False)
class Resident:
    artifact: Artifact
    device: str
    footprint: Footprint
    window: int
    parallel: int
    simulated: bool
    engine: Engine
    _state: ResidentState = field(default=ResidentState.STARTING, init=False)
    calls: int = 0
    slots_taken: int = 0  # of ``parallel``: a call takes as many as the choices it asks for
    cells_taken: int = 0  # of a unified pool: what its calls may come to hold (core/slots.py)
    last_used: float = field(default_factory=time.monotonic)
    # the last byte any of its calls received (monotonic): the engine's progress, which the
    # hang watchdog stamps and reads, so a call queued for a slot is not taken for a hang
    progress_at: float = field(default_factory=time.monotonic)
    child: Child | None = None
    load_started_at: float | None = None  # unix stamps, for the call log
    ready_at: float | None = None
    load_seconds: float | None = None
    ready: asyncio.Future[None] = field(default_factory=_quiet_future)
    basis: str = "estimate"  # or "measured": where ``footprint`` came from
    pinned: bool = False
    child_start_time: float = 0.0  # the process start time recorded with it (orphans.py)
    loaded_by_call: int | None = None
    place: Place | None = None  # the core's decision it was loaded under
    asked: str = ""  # the name (pins stripped) it was loaded for: its knobs are found by it
    band: int = 1  # priority band (a knob): what displacing it costs, times its reload
    expected_ends: dict[int, float | None] = field(default_factory=dict)  # per call
    served: int = 0  # calls it has taken since it was loaded
    room_seen: int = 0  # consecutive checks that found room for a larger window
    cores_seen: int = 0  # consecutive checks that found more cores than its threads
    embeddings: bool = False  # a decoder also serving embeddings (the embeddings knob)

    def eta_idle(self) -> float | None:
        """Seconds until its calls are expected done; None when any is unmeasured."""
        if not self.expected_ends:
            return 0.0 if self.calls == 0 else None
        ends = list(self.expected_ends.values())
        if any(end is None for end in ends):
            return None
        return max(max(e for e in ends if e is not None) - time.monotonic(), 0.0)

    held: dict[str, int] = field(default_factory=dict)  # bytes per device
    # what its engine says it occupies now of ``footprint`` (a cache that grows with its
    # tokens, box/growth.py); None: all of it, from the load on (llama-server allocates it)
    held_now: int | None = None
    cpus: frozenset[int] = frozenset()  # logical CPUs of its claim
    lost_cores: set[int] = field(default_factory=set)  # taken by a later claim while idle

    @property
    def state(self) -> ResidentState:
        return self._state

    def relaunched(self, place: Place, cpus: frozenset[int], embeddings: bool) -> Resident:
        """The same file under the same contract (window, slots, caches, bytes, pin, idle
        clock) launched again on ``place``'s cores: what an idle engine a claim would crowd
        starts again as, a thread per core it keeps (box/admit.py); ``embeddings`` as its
        settings say now (box/launches.py), never as recorded."""
        return Resident(
            artifact=self.artifact,
            device=self.device,
            footprint=self.footprint,
            window=self.window,
            parallel=self.parallel,
            simulated=self.simulated,
            engine=self.engine,
            last_used=self.last_used,
            basis=self.basis,
            pinned=self.pinned,
            place=place,
            asked=self.asked,
            band=self.band,
            embeddings=embeddings,
            held=dict(self.held),
            cpus=cpus,
        )

    @property
    def rung(self) -> Rung:
        return self.place.rung if self.place else Rung.RAM_ONLY

    @property
    def threads(self) -> int:
        """The engine threads it was launched with: one per core of its claim."""
        return len(self.place.cores) if self.place is not None else 0

    @property
    def cores(self) -> tuple[int, ...]:
        if self.place is None:
            return ()
        return tuple(c for c in self.place.cores if c not in self.lost_cores)

    @property
    def slots(self) -> Slots:
        return Slots(self.parallel, self.place.kv_unified if self.place else False)

    def has_slots(self, wanted: int) -> bool:
        """Whether a call wanting ``wanted`` slots may start on it now (else it waits at
        fitbox's door, never in the engine's queue)."""
        return self.slots_taken + wanted <= self.at_once

    @property
    def at_once(self) -> int:
        """The calls its child truly runs at once: its engine's slots of ``parallel`` (a
        transformers child runs one; llama-server all of them)."""
        return self.engine.slots(self.parallel)

    def cells_for(self, demand: Demand | None) -> int:
        """The cells of its shared pool a call of ``demand`` holds; 0 where its slots have
        cells of their own, or for a call that generates nothing (embeddings, tokenize)."""
        pool = self.slots.pool(self.window)
        return 0 if pool is None or demand is None else demand.cells(pool)

    def has_room(self, wanted: int, cells: int) -> bool:
        """Whether a call wanting ``wanted`` slots and ``cells`` cells of the shared pool may
        start on it now: else it waits at fitbox's door, where the queue shows it, and
        never meets another call in the engine's full pool (both would fail)."""
        pool = self.slots.pool(self.window)
        return self.has_slots(wanted) and (pool is None or admits(pool, self.cells_taken, cells))

    @property
    def type_k(self) -> str:
        return self.place.type_k if self.place else "f16"

    @property
    def type_v(self) -> str:
        return self.place.type_v if self.place else "f16"

    def holdings(self) -> dict[str, int]:
        return self.held or {self.device: self.footprint.total}

    def in_use(self) -> dict[str, int]:
        """Bytes per device that a free-memory reading (MemAvailable, NVML free) already
        shows as taken by it. Weights in host RAM are mmap'd, clean page cache that
        MemAvailable counts as available, so the host shows only the rest. A resident whose
        engine reports what it holds now shows that; its budget less that is what it may
        still grow into, which the room keeps for it (FORMULAS.md §Room per device)."""
        used = dict(self.holdings())
        if self.held_now is not None and len(used) == 1:
            used[self.device] = min(self.held_now, self.footprint.total)
        if "host" in used:
            used["host"] = (
                max(used["host"] - self.footprint.weights, 0) if (self.device == "host") else 0
            )
        return used

    @property
    def key(self) -> str:
        return self.artifact.key

    def view(self) -> ResidentView:
        return ResidentView(
            key=self.key,
            device=self.device,
            bytes=self.footprint.total,
            state=self.state,
            calls=self.calls,
            last_used=self.last_used,
            pinned=self.pinned,
            held=tuple(sorted(self.holdings().items())),
            cores=self.cores,
            reload_seconds=self.load_seconds,
            band=self.band,
            eta_idle=self.eta_idle() if self.state is ResidentState.READY else None,
        )

    def describe(self) -> dict[str, Any]:
        return {
            "model": self.artifact.name,
            "artifact": str(self.artifact.path),
            "task": self.artifact.task,  # None: a chat, embedding or reranking model
            "state": self.state.value,
            "device": self.device,
            "simulated": self.simulated,
            "bytes": self.footprint.total,
            "basis": self.basis,
            "footprint": {
                "weights": self.footprint.weights,
                "kv": self.footprint.kv,
                "compute": self.footprint.compute,
                "output": self.footprint.output,
            },
            "window": self.window,
            "parallel": self.parallel,
            "kv_unified": self.slots.unified,
            "slots_taken": self.slots_taken,
            "cells": self.slots.pool(self.window),  # None: each slot has its own
            "cells_taken": self.cells_taken,
            "rung": self.rung.value,
            "type_k": self.type_k,
            "type_v": self.type_v,
            "devices": self.holdings(),
            "held_now": self.held_now,  # None: all of its footprint (nothing grows)
            "gpu_layers": self.place.gpu_layers if self.place else 0,
            "tensor_split": list(self.place.tensor_split) if self.place else [],
            "cores": list(self.cores),
            "calls": self.calls,
            "pinned": self.pinned,
            "embeddings": self.embeddings and not self.artifact.facts.is_embedding,
            "idle_for_s": round(time.monotonic() - self.last_used, 3) if not self.calls else 0,
            "pid": self.child.pid if self.child else None,
            "port": self.child.port if self.child else None,
            "load_seconds": self.load_seconds,
        }
