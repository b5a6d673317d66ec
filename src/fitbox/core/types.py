"""The shared vocabulary of placement: devices, residents, asks and decisions."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class DeviceKind(StrEnum):
    HOST = "host"
    GPU = "gpu"


@dataclass(frozen=True)
class Device:
    """A pool of memory fitbox may fill. ``capacity`` is already capped by every tier."""

    id: str  # "host", "gpu0", "gpu1", ...
    kind: DeviceKind
    capacity: int
    simulated: bool = False


class ResidentState(StrEnum):
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"


@dataclass(frozen=True)
class ResidentView:
    """What the core needs to know of a loaded (or loading, or leaving) child."""

    key: str
    device: str
    bytes: int
    state: ResidentState
    calls: int  # calls in flight or waiting on it; a resident with calls is never a victim
    last_used: float  # the shell's monotonic clock; only the order matters here
    pinned: bool = False  # an operator said keep it: never a victim


@dataclass(frozen=True)
class Snapshot:
    devices: tuple[Device, ...]
    residents: tuple[ResidentView, ...]


@dataclass(frozen=True)
class Footprint:
    """Bytes one model takes at one window: the terms of FORMULAS.md."""

    weights: int
    kv: int
    compute: int
    output: int

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute + self.output


@dataclass(frozen=True)
class Ask:
    key: str
    footprint: Footprint  # the estimate, for any device without a figure of its own
    kinds: tuple[DeviceKind, ...] = (DeviceKind.GPU, DeviceKind.HOST)
    measured: tuple[tuple[str, Footprint], ...] = ()  # (device id, what a load there took)

    def footprint_on(self, device: str) -> Footprint:
        for device_id, footprint in self.measured:
            if device_id == device:
                return footprint
        return self.footprint


class VictimReason(StrEnum):
    LEAST_RECENTLY_USED = "least_recently_used"


class WaitReason(StrEnum):
    BUSY_RESIDENTS = "busy_residents"  # room exists once these finish their calls


class RefuseReason(StrEnum):
    LARGER_THAN_BOX = "larger_than_box"  # even an empty box could not hold it
    HELD_BY_PINNED = "held_by_pinned"  # only pinned residents could make room


@dataclass(frozen=True)
class Victim:
    key: str
    bytes: int
    reason: VictimReason


@dataclass(frozen=True)
class Place:
    device: str
    victims: tuple[Victim, ...]


@dataclass(frozen=True)
class Wait:
    reason: WaitReason
    blockers: tuple[str, ...]
    needed: int
    available: int  # the most any device could offer now, evicting every idle resident


@dataclass(frozen=True)
class Refuse:
    reason: RefuseReason
    needed: int
    available: int  # the largest capacity, or (held_by_pinned) the most room possible now
    holders: tuple[str, ...] = ()  # held_by_pinned: the pinned residents in the way


Decision = Place | Wait | Refuse
