"""Calls waiting for room, and the order freed room goes to them (core/admission.py)."""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from typing import Any

from fitbox.core import admission
from fitbox.core.types import Rung
from fitbox.models.catalog import Artifact

from .facts import Facts
from .speeds import SpeedBook


@dataclass
class Waiter:
    """One call waiting for room. ``load`` and ``output`` (seconds, measured rates only)
    order it; the rest is what /v1/queue shows."""

    model: str
    call_id: int | None
    since: float
    deadline: float
    arrived: int  # arrival order
    max_wait: float
    load: float | None = None
    output: float | None = None
    blocked_by: list[str] = field(default_factory=list)
    # what it needs of its resident's shared pool of cells, and what its calls hold now
    cells: dict[str, int] | None = None

    def view(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "call_id": self.call_id,
            "since": self.since,
            "deadline": self.deadline,
            "blocked_by": self.blocked_by,
            "cells": self.cells,
        }


class WaitingRoom:
    def __init__(self) -> None:
        self._waiters: list[Waiter] = []
        self._arrivals = 0

    def __bool__(self) -> bool:
        return bool(self._waiters)

    def __len__(self) -> int:
        return len(self._waiters)

    def enter(
        self,
        model: str,
        call_id: int | None,
        remaining: float,
        max_wait: float,
        eta: tuple[float | None, float | None],
    ) -> Waiter:
        self._arrivals += 1
        now = time.time()
        waiter = Waiter(model, call_id, now, now + remaining, self._arrivals, max_wait, *eta)
        self._waiters.append(waiter)
        return waiter

    def leave(self, waiter: Waiter | None) -> None:
        if waiter in self._waiters:
            self._waiters.remove(waiter)

    def ordered(self, policy: str) -> list[Waiter]:
        now = time.time()
        by_arrival = {w.arrived: w for w in self._waiters}
        tickets = admission.order(
            [
                admission.Ticket(
                    id=w.arrived,
                    model=w.model,
                    arrived=w.arrived,
                    waited=now - w.since,
                    max_wait=w.max_wait,
                    ready_in=0.0,
                    load=w.load,
                    output=w.output,
                )
                for w in self._waiters
            ],
            admission.Policy(policy),
        )
        return [by_arrival[t.id] for t in tickets]

    def ahead_of(self, waiter: Waiter | None, policy: str) -> list[str]:
        """Models of the calls admitted before ``waiter`` (all of them, for a new call)."""
        ahead = []
        for other in self.ordered(policy):
            if other is waiter:
                break
            ahead.append(other.model)
        return ahead


def waiter_eta(
    speeds: SpeedBook, facts: Facts, artifact: Artifact, max_tokens: int, work: float | None = None
) -> tuple[float | None, float | None]:
    """A waiting call's (load, output) seconds, from measured rates only; a task call's
    output from its ``work`` at its model's measured units per second."""
    if work is not None:
        output = speeds.tasks.seconds(artifact, work)
        return (None, None) if output is None else (facts.load_seconds(artifact), output)
    rates = speeds.by_rung(artifact)
    rate = next(
        (
            rates[r.value]
            for r in Rung  # the first rung, in ladder order, measured
            if r.value in rates and rates[r.value].decode_ms is not None
        ),
        None,
    )
    if rate is None or rate.decode_ms is None:
        return None, None
    output = max_tokens * rate.decode_ms / 1000 if max_tokens else None
    return facts.load_seconds(artifact), output


def slot_wait(ends: list[float | None], free: int, ahead: list[float | None]) -> float | None:
    """Seconds until a new call gets a slot of a resident: ``ends``, the seconds left of each
    call it serves (None: unmeasured); ``free``, its slots no call holds; ``ahead``, how long
    each call waiting for it before the new one should take (its output at the measured
    rate). 0 when a slot is left after those ahead take theirs; None when the answer rests
    on a figure not measured (a call asked for no ``max_tokens``, a model never timed)."""
    if free > len(ahead):
        return 0.0
    if any(e is None for e in ends) or any(a is None for a in ahead):
        return None
    slots = [0.0] * max(free, 0) + sorted(float(e) for e in ends if e is not None)
    if not slots:
        return None
    heapq.heapify(slots)
    for seconds in ahead:  # each takes the slot that frees first, and holds it that long
        heapq.heappush(slots, heapq.heappop(slots) + float(seconds or 0.0))
    return heapq.heappop(slots)
