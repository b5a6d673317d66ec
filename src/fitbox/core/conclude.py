"""From what fits to the answer: the goal ranks the options, a wait beats them only when a
better one is expected within the call's max wait, else the binding refusal
(FORMULAS.md §Goals, §Refusals)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from fitbox.core.decision import (
    Decision,
    Refuse,
    RefuseReason,
    Rejected,
    RejectReason,
    Wait,
    WaitReason,
)
from fitbox.core.search import Option, Refusal, Search
from fitbox.core.types import Goal


def rank(goal: Goal, timed: bool) -> Callable[[Option], tuple[float, ...]]:
    def key(o: Option) -> tuple[float, ...]:
        if not timed:  # a speed is never invented: unmeasured candidates keep ladder order
            return (o.position,)
        t = o.seconds if o.seconds is not None else 0.0
        if goal is Goal.FAST:
            return (t, o.q, o.reload, o.position)
        if goal is Goal.RESIDENT:
            return (o.q, o.hot, t + o.reload, o.position)
        return (o.q, t + o.reload, t, o.position)

    return key


def conclude(search: Search) -> Decision:
    ask = search.ask
    every = search.options + search.hopeful
    timed = all(o.seconds is not None for o in every)
    key = rank(ask.goal, timed)
    if search.options:
        best = min(search.options, key=key)
        better = [
            h
            for h in search.hopeful
            if key(h) < key(best) and h.eta is not None and h.eta <= ask.max_wait
        ]
        if better:
            soonest = min(better, key=lambda h: (h.eta or 0.0, key(h)))
            return Wait(
                WaitReason.BETTER_SOON,
                soonest.blockers,
                needed=soonest.place.bytes_on(soonest.place.device),
                available=search.room.most.get(soonest.place.device, 0),
                bound=soonest.eta or 0.0,
                rejected=tuple(search.rejected),
            )
        others = [
            Rejected(
                o.place.artifact,
                o.place.rung,
                f"{o.place.type_k}/{o.place.type_v}",
                RejectReason.NOT_CHOSEN,
                f"the {ask.goal.value} goal ranked "
                f"{best.place.rung.value} of {best.place.artifact} first",
            )
            for o in search.options
            if o is not best
        ]
        counts = best.counts() if best.counts is not None else ()  # priced for the winner only
        return replace(best.place, rejected=tuple(search.rejected + others), device_counts=counts)
    if search.hopeful:
        first = min(search.hopeful, key=key)
        blockers = sorted({b for h in search.hopeful for b in h.blockers})
        return Wait(
            WaitReason.BUSY_RESIDENTS,
            tuple(blockers),
            needed=first.place.bytes_on(first.place.device),
            available=search.room.most.get(first.place.device, 0),
            bound=ask.max_wait,
            rejected=tuple(search.rejected),
        )
    return refuse(search)


def refuse(search: Search) -> Refuse:
    rejected = tuple(search.rejected)
    by_reason: dict[RejectReason, list[Refusal]] = {}
    for refusal in search.refusals:
        by_reason.setdefault(refusal.reason, []).append(refusal)
    for reason, refuse_as in (
        (RejectReason.HELD_BY_PINNED, RefuseReason.HELD_BY_PINNED),
        (RejectReason.NO_CORES, RefuseReason.NO_CORES),
        (RejectReason.LARGER_THAN_BOX, RefuseReason.LARGER_THAN_BOX),
    ):
        if reason in by_reason:  # the nearest miss names the numbers
            r = min(by_reason[reason], key=lambda r: r.needed - r.available)
            return Refuse(
                refuse_as,
                r.needed,
                r.available,
                holders=r.holders,
                device=r.device,
                detail=_first_detail(rejected, reason),
                rejected=rejected,
                footprint=r.footprint,
                window=r.window,
            )
    context = [
        r
        for r in rejected
        if r.reason in (RejectReason.BEYOND_TRAINING, RejectReason.REFUSED_WINDOW)
    ]
    if context:
        return Refuse(
            RefuseReason.CONTEXT, search.ask.need, 0, detail=context[0].detail, rejected=rejected
        )
    return Refuse(
        RefuseReason.NO_CANDIDATE,
        0,
        0,
        detail="no rung applies to this model on this box",
        rejected=rejected,
    )


def _first_detail(rejected: tuple[Rejected, ...], reason: RejectReason) -> str:
    return next((r.detail for r in rejected if r.reason is reason), "")
