"""Verdicts: every (variant, rung, K/V type) of an ask priced against the snapshot, without
the early stops ``decide`` takes, next to the pick ``decide`` makes (the Auto pick).

What an operator reads to see why fitbox chose what it chose, and what else could run.
"""

from __future__ import annotations

from dataclasses import dataclass

from fitbox.core.ask import Ask
from fitbox.core.decide import decide, rung_jobs, try_kv
from fitbox.core.decision import Band, Decision, Place, Rejected
from fitbox.core.room import Room
from fitbox.core.search import Search
from fitbox.core.types import Footprint, Goal, Rung, Snapshot


@dataclass(frozen=True)
class Verdict:
    artifact: str
    rung: Rung
    type_k: str
    type_v: str
    admissible: bool
    waits: bool  # possible once busy residents settle
    window: int = 0
    band: Band | None = None
    footprint: tuple[tuple[str, Footprint], ...] = ()
    victims: tuple[str, ...] = ()
    cores: tuple[int, ...] = ()
    predicted_seconds: float | None = None
    rejected: Rejected | None = None


def verdicts(snapshot: Snapshot, ask: Ask) -> tuple[list[Verdict], Decision]:
    room = Room(snapshot)
    found: list[Verdict] = []
    for q, owner, artifact, rung in rung_jobs(ask, Goal.QUALITY):
        for type_k, type_v in ask.kv_types:
            search = Search(snapshot, ask, room)
            if rung is Rung.FOUR_BIT and artifact is owner:
                found.append(Verdict(owner.key, rung, type_k, type_v, False, False))
                continue
            try_kv(search, q, artifact, rung, type_k, type_v)
            why = search.rejected[-1] if search.rejected else None
            if search.options:
                place: Place = search.options[0].place
                found.append(
                    Verdict(
                        artifact.key,
                        rung,
                        type_k,
                        type_v,
                        True,
                        False,
                        place.window,
                        place.band,
                        place.footprint,
                        tuple(v.key for v in place.victims),
                        place.cores,
                        place.predicted_seconds,
                    )
                )
            elif search.hopeful:
                place = search.hopeful[0].place
                found.append(
                    Verdict(
                        artifact.key,
                        rung,
                        type_k,
                        type_v,
                        False,
                        True,
                        place.window,
                        footprint=place.footprint,
                        rejected=why,
                    )
                )
            else:
                found.append(
                    Verdict(artifact.key, rung, type_k, type_v, False, False, rejected=why)
                )
    return found, decide(snapshot, ask)
