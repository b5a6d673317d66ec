"""The shared vocabulary of placement: devices, residents, the snapshot, footprints, rungs.

What a call asks for is in ``ask.py``; what the core answers is in ``decision.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class DeviceKind(StrEnum):
    HOST = "host"
    GPU = "gpu"


@dataclass(frozen=True)
class Device:
    """A pool of memory fitbox may fill. ``capacity`` is already capped by every tier and
    charged with what other processes use (``tiers.capacity``)."""

    id: str  # "host", "gpu0", "gpu1", ...
    kind: DeviceKind
    capacity: int
    simulated: bool = False


class ResidentState(StrEnum):
    """A child's life (box/residents.py owns the transitions). The core sees starting,
    ready and stopping; stopped and failed residents have left the registry."""

    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"


@dataclass(frozen=True)
class ResidentView:
    """What the core needs to know of a loaded (or loading, or leaving) child."""

    key: str
    device: str  # where most of it lives; ``held`` has every device when it spans several
    bytes: int
    state: ResidentState
    calls: int  # calls in flight or waiting on it; a resident with calls is never a victim
    last_used: float  # the shell's monotonic clock; only the order matters here
    pinned: bool = False  # an operator said keep it: never a victim
    held: tuple[tuple[str, int], ...] = ()  # (device, bytes) when it spans devices
    cores: tuple[int, ...] = ()  # the physical cores its claim holds
    band: int = 1  # priority band: 1 normal, higher costs more to displace
    reload_seconds: float | None = None  # measured: what bringing it back would cost
    eta_idle: float | None = None  # seconds until its calls are done, from measured rates

    def holdings(self) -> tuple[tuple[str, int], ...]:
        return self.held or ((self.device, self.bytes),)

    def bytes_on(self, device: str) -> int:
        return sum(b for d, b in self.holdings() if d == device)

    @property
    def idle(self) -> bool:
        """Loaded with no calls: its cores may go to the next claim, pinned or not."""
        return self.state is ResidentState.READY and self.calls == 0

    @property
    def evictable(self) -> bool:
        return self.state is ResidentState.READY and self.calls == 0 and not self.pinned

    @property
    def settles(self) -> bool:
        """Leaving, or busy or loading but not pinned: its room frees up without anyone
        choosing to evict it."""
        if self.state is ResidentState.STOPPING:
            return True
        return not self.pinned and not self.evictable


@dataclass(frozen=True)
class Reservation:
    """Bytes promised but not yet visible in any reading (a cache that will grow, ...)."""

    device: str
    bytes: int
    why: str


@dataclass(frozen=True)
class Snapshot:
    devices: tuple[Device, ...]
    residents: tuple[ResidentView, ...]
    cores: tuple[int, ...] = ()  # physical cores fitbox may claim; empty: claims not made
    busy_cores: tuple[int, ...] = ()  # kept busy by other work: claimed last
    lend_reserved: bool = True  # the reserved core may be lent (no cores tier set: --cpu-max)
    reservations: tuple[Reservation, ...] = ()

    def device(self, device_id: str) -> Device | None:
        return next((d for d in self.devices if d.id == device_id), None)

    def held_by_device(self) -> dict[str, int]:
        """Bytes the residents hold, summed per device."""
        held: dict[str, int] = {}
        for r in self.residents:
            for device, size in r.holdings():
                held[device] = held.get(device, 0) + size
        return held


@dataclass(frozen=True)
class Footprint:
    """Bytes one model takes on one device at one window: the terms of FORMULAS.md."""

    weights: int
    kv: int
    compute: int
    output: int

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute + self.output


class Rung(StrEnum):
    """How a model's weights are placed (FORMULAS.md §Rungs has the flags of each)."""

    GPU_ONLY = "gpu-only"
    MOE_SPLIT = "moe-split"
    FOUR_BIT = "4bit"
    RAM_ONLY = "ram-only"
    MAX_RAM = "max-ram"
    MAX_GPU = "max-gpu"


RUNG_ORDER: tuple[Rung, ...] = tuple(Rung)
WEIGHTS_IN_RAM = frozenset({Rung.MOE_SPLIT, Rung.RAM_ONLY, Rung.MAX_RAM, Rung.MAX_GPU})


class Goal(StrEnum):
    QUALITY = "quality"
    FAST = "fast"
    RESIDENT = "resident"


class Priority(StrEnum):
    FOREGROUND = "foreground"
    BACKGROUND = "background"
