"""Whether a call to a model whose resident boxes would queue it goes to another box that
can place it: the predicted waits, compared. A pure decision over what the central was told.

- the busy side: each box with the model resident and every slot taken says, at each
  long-poll answer, how long a new call would wait for one of its slots (``queue_eta``, from
  the measured ends of the calls it serves and of those queued before it; box/waiting.py
  ``slot_wait``), counted down since (``BoxLink.predicted_wait``). The shortest is the wait.
- the other side: a box that places the model without evicting a serving one (its own
  ``/v1/plan``) waits its load (``predicted_seconds``: the load measured there, or by
  another box for the same file and offered to it, central/facts.py) plus its own queue for
  the model (none, as it is not resident there).

The call spills when the busy side's wait exceeds the other's. When either figure is
unknown (a call asked for no ``max_tokens``, a model never loaded anywhere) it spills as
before: loading beats queueing behind slots that are all taken. The figures go to the
client in ``x-fitbox-spill``, taken or declined."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from fitbox.central.mirror import BoxLink

HEADER = "x-fitbox-spill"


@dataclass(frozen=True)
class Spill:
    busy: str  # the busy box with the shortest predicted wait
    wait_s: float | None  # its wait for a slot
    to: str  # the box that would place the model, the soonest ready
    to_wait_s: float | None  # its load and its queue
    load_s: float | None  # its load alone
    taken: bool

    def header(self) -> str:
        """``from=BOX; wait=S; to=BOX; wait=S; load=S; taken|declined`` (S: seconds, or
        ``unknown``)."""
        return (
            f"from={self.busy}; wait={_s(self.wait_s)}; to={self.to}; "
            f"wait={_s(self.to_wait_s)}; load={_s(self.load_s)}; "
            + ("taken" if self.taken else "declined")
        )


def _s(seconds: float | None) -> str:
    return "unknown" if seconds is None else f"{seconds:.1f}"


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _soonest(links: list[BoxLink], wait: dict[str, float | None]) -> tuple[BoxLink, float | None]:
    """The link with the shortest known wait (the first, by the order given, when none is)."""
    best = min(
        links, key=lambda link: (wait[link.record.box_id] is None, wait[link.record.box_id] or 0.0)
    )
    return best, wait[best.record.box_id]


def _busy_wait(link: BoxLink, model: str) -> float | None:
    """The wait for a slot of a box the central counts full (its own calls there and the
    box's queue, against the slots). A box that said a slot was free said so before the
    central's calls took its slots (taking a slot moves no counter, so nothing newer came):
    unknown, as is a wait that cannot be known."""
    wait = link.predicted_wait(model)
    return None if wait == 0.0 else wait


def decide(
    busy: list[tuple[BoxLink, str]], placing: list[tuple[BoxLink, str, dict[str, Any]]]
) -> tuple[Spill, list[BoxLink]]:
    """``busy``: the boxes with the model resident and every slot taken, each with the name
    it knows the model by, least busy first; ``placing``: those that place it without
    evicting a serving model, with their plans, in the order to try. The decision, and the
    placing boxes in the order to try them (the soonest ready first)."""
    waits = {link.record.box_id: _busy_wait(link, name) for link, name in busy}
    loads = {
        link.record.box_id: _number(plan.get("predicted_seconds")) for link, _, plan in placing
    }
    ready_in: dict[str, float | None] = {}
    for link, name, _ in placing:
        load, queued = loads[link.record.box_id], link.predicted_wait(name)
        ready_in[link.record.box_id] = None if load is None or queued is None else load + queued
    first, wait = _soonest([link for link, _ in busy], waits)
    order = sorted(
        (link for link, _, _ in placing),
        key=lambda link: (ready_in[link.record.box_id] is None, ready_in[link.record.box_id] or 0),
    )
    to = order[0]
    to_wait = ready_in[to.record.box_id]
    taken = wait is None or to_wait is None or wait > to_wait
    spill = Spill(
        first.record.box_id, wait, to.record.box_id, to_wait, loads[to.record.box_id], taken
    )
    return spill, order
