"""The working state of one decision: what has been tried, what fits, what was refused."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from fitbox.core.ask import Ask
from fitbox.core.decision import Band, DeviceCount, Place, Rejected, RejectReason
from fitbox.core.room import Room
from fitbox.core.split import Placement
from fitbox.core.types import Footprint, Snapshot


@dataclass
class Fit:
    placement: Placement
    window: int
    need: dict[str, Footprint]
    band: Band
    # a multi-GPU rung: the window each device count holds, priced only for the winner
    counts: Callable[[], tuple[DeviceCount, ...]] | None = None


@dataclass
class Option:
    place: Place
    q: int
    position: int  # order of evaluation: the ladder order
    seconds: float | None  # T
    reload: float  # R: cost of the residents displaced
    hot: int  # E_hot: high-priority residents displaced
    blockers: tuple[str, ...] = ()  # a hopeful option: who must settle first
    eta: float | None = None  # hopeful: when they are expected to settle
    counts: Callable[[], tuple[DeviceCount, ...]] | None = None


@dataclass(frozen=True)
class Refusal:
    reason: RejectReason
    device: str
    needed: int
    available: int
    holders: tuple[str, ...] = ()
    footprint: Footprint | None = None
    window: int = 0


@dataclass
class Search:
    snapshot: Snapshot
    ask: Ask
    room: Room
    options: list[Option] = field(default_factory=list)
    hopeful: list[Option] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    position: int = 0
    # the GPU sets tried (first, then), once per snapshot: devicesets.gpu_sets
    gpu_sets: tuple[list[list[tuple[str, ...]]], list[list[tuple[str, ...]]]] | None = None
