"""Calls waiting for room, and the order freed room goes to them (core/admission.py)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from fitbox.core import admission
from fitbox.core.types import Rung
from fitbox.models.catalog import Artifact
from fitbox.store.db import MeasuredFootprint

from .pricing import MeasuredKey
from .speeds import SpeedBook

HIDDEN = ("arrived", "max_wait", "load", "output")  # kept for ordering, not shown


class WaitingRoom:
    def __init__(self) -> None:
        self.entries: dict[object, dict[str, Any]] = {}
        self._arrivals = 0

    def __bool__(self) -> bool:
        return bool(self.entries)

    def enter(self, ticket: object, model: str, call_id: int | None, remaining: float,
              max_wait: float, eta: Mapping[str, float | None]) -> None:  # fmt: skip
        if ticket in self.entries:
            return
        self._arrivals += 1
        now = time.time()
        self.entries[ticket] = {
            "model": model, "call_id": call_id, "since": now, "deadline": now + remaining,
            "arrived": self._arrivals, "max_wait": max_wait, **eta,
        }  # fmt: skip

    def blocked(self, ticket: object, blockers: list[str]) -> None:
        self.entries[ticket]["blocked_by"] = blockers

    def leave(self, ticket: object) -> None:
        self.entries.pop(ticket, None)

    def tickets(self, policy: str) -> list[admission.Ticket]:
        now = time.time()
        return admission.order([
            admission.Ticket(id=w["arrived"], model=w["model"], arrived=w["arrived"],
                             waited=now - w["since"], max_wait=w["max_wait"], ready_in=0.0,
                             load=w["load"], output=w["output"])
            for w in self.entries.values()
        ], admission.Policy(policy))  # fmt: skip

    def view(self, policy: str) -> list[dict[str, Any]]:
        """Waiting calls in admission order, as /v1/queue shows them."""
        order = {t.id: i for i, t in enumerate(self.tickets(policy))}
        waiting = sorted(self.entries.values(), key=lambda w: order.get(w["arrived"], 0))
        return [{k: v for k, v in w.items() if k not in HIDDEN} for w in waiting]

    def ahead_of(self, ticket: object, policy: str) -> list[str]:
        """Models of the calls admitted before ``ticket`` (all of them, for a new call)."""
        mine = self.entries.get(ticket, {}).get("arrived")
        ahead = []
        for t in self.tickets(policy):
            if t.id == mine:
                break
            ahead.append(t.model)
        return ahead


def ticket_eta(speeds: SpeedBook, measured: Mapping[MeasuredKey, MeasuredFootprint],
               artifact: Artifact, max_tokens: int) -> dict[str, float | None]:  # fmt: skip
    """A waiting call's load and output seconds, from measured rates only."""
    rates = speeds.by_rung(artifact)
    rate = next((rates[r.value] for r in Rung  # the first rung, in ladder order, measured
                 if r.value in rates and rates[r.value].decode_ms is not None), None)  # fmt: skip
    if rate is None or rate.decode_ms is None:
        return {"load": None, "output": None}
    loaded = next((m for k, m in measured.items()
                   if k[0] == str(artifact.path) and m.load_seconds), None)  # fmt: skip
    output = max_tokens * rate.decode_ms / 1000 if max_tokens else None
    return {"load": loaded.load_seconds if loaded else None, "output": output}
