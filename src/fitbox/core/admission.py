"""The admission queue's order (FORMULAS.md §Admission).

``eta`` (default): shortest expected completion first, from measured rates only; a ticket
with no history keeps its arrival slot; a group (session) is never reordered; background
tickets run after every foreground one; a ticket whose max wait has passed, or would pass
by the time it finishes, is promoted to the front (oldest first).
``smart``: tickets for the same model run together, models in order of first arrival — one
load serves a batch instead of swapping back and forth.
``fifo``: arrival order.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


class Policy(StrEnum):
    ETA = "eta"
    SMART = "smart"
    FIFO = "fifo"


@dataclass(frozen=True)
class Ticket:
    id: int
    model: str
    arrived: int  # arrival sequence number
    waited: float = 0.0  # seconds since arrival
    max_wait: float = 120.0
    group: str | None = None
    background: bool = False
    ready_in: float | None = None  # seconds until its model is ready (0: resident and idle)
    load: float | None = None  # measured load seconds (0 when resident)
    output: float | None = None  # measured decode seconds for its max tokens

    @property
    def eta(self) -> float | None:
        parts = (self.ready_in, self.load, self.output)
        return None if any(p is None for p in parts) else sum(p for p in parts if p is not None)

    @property
    def overdue(self) -> bool:
        if self.waited >= self.max_wait:
            return True
        eta = self.eta
        return eta is not None and self.waited + eta >= self.max_wait


def order(tickets: Sequence[Ticket], policy: Policy = Policy.ETA) -> list[Ticket]:
    by_arrival = sorted(tickets, key=lambda t: (t.arrived, t.id))
    foreground = [t for t in by_arrival if not t.background]
    background = [t for t in by_arrival if t.background]
    return _order(foreground, policy) + _order(background, policy)


def _order(tickets: list[Ticket], policy: Policy) -> list[Ticket]:
    if policy is Policy.FIFO:
        return tickets
    promoted = [t for t in tickets if t.overdue] if policy is Policy.ETA else []
    rest = [t for t in tickets if t not in promoted]
    if policy is Policy.SMART:
        first: dict[str, int] = {}
        for t in rest:
            first.setdefault(t.model, t.arrived)
        ordered = sorted(rest, key=lambda t: (first[t.model], t.arrived, t.id))
    else:
        ordered = list(rest)
        slots = [i for i, t in enumerate(rest) if t.eta is not None]
        by_eta = sorted((rest[i] for i in slots), key=lambda t: (t.eta, t.arrived, t.id))
        for slot, ticket in zip(slots, by_eta, strict=True):
            ordered[slot] = ticket
    return promoted + _keep_groups(ordered)


def _keep_groups(ordered: list[Ticket]) -> list[Ticket]:
    """Within each group, the slots its tickets hold are refilled in arrival order."""
    result = list(ordered)
    groups: dict[str, list[int]] = {}
    for i, t in enumerate(ordered):
        if t.group is not None:
            groups.setdefault(t.group, []).append(i)
    for positions in groups.values():
        members = sorted((ordered[i] for i in positions), key=lambda t: (t.arrived, t.id))
        for i, ticket in zip(positions, members, strict=True):
            result[i] = ticket
    return result


def task_seconds(work: float | None, rates: Sequence[float]) -> float | None:
    """Seconds a task call (speech, transcription, images) is expected to take: its work in
    its runner's units (audio seconds to transcribe, characters to speak, images to make)
    over the median of its model's measured units per second; None when either is unknown."""
    known = [r for r in rates if r > 0]
    if work is None or work < 0 or not known:
        return None
    return work / statistics.median(known)
