"""Which idle residents leave so a placement fits: the cheapest set that frees enough.

Cost of a victim = reload seconds x priority band (FORMULAS.md §Eviction). Choosing the
cheapest covering set exactly is a knapsack; this is the greedy cover (most bytes where they
are short per unit of cost first) followed by reverse deletion (drop any victim the rest
already cover, dearest first): O(n^2) in the residents, and it never evicts anything when
nothing is short.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fitbox.core.decision import Victim, VictimReason
from fitbox.core.types import ResidentView

# A resident whose reload was never measured is priced as if it loaded at this rate. It only
# orders victims (a cost, not a prediction shown to anyone); FORMULAS.md §Eviction says why.
ASSUMED_RELOAD_BYTES_PER_S = 1 << 30


def cost(resident: ResidentView) -> float:
    seconds = resident.reload_seconds
    if seconds is None:
        seconds = resident.bytes / ASSUMED_RELOAD_BYTES_PER_S
    return max(seconds, 1e-6) * max(resident.band, 1)


def choose(short: Mapping[str, int], candidates: Sequence[ResidentView]) -> list[Victim] | None:
    """Victims that cover every device's shortfall (bytes), or None if all of them cannot."""
    need = {d: b for d, b in short.items() if b > 0}
    if not need:
        return []
    # only residents holding bytes where room is short can help: the rest are never chosen,
    # so leaving them out changes nothing but the time (the core asks this per device set)
    held: dict[int, dict[str, int]] = {}
    for r in candidates:
        on = dict.fromkeys(need, 0)
        for device, size in r.holdings():
            if device in on:
                on[device] += size
        if any(on.values()):
            held[id(r)] = on
    pool = sorted(
        (r for r in candidates if id(r) in held), key=lambda r: (r.last_used, r.key)
    )  # deterministic ties: LRU

    price = {id(r): cost(r) for r in pool}
    parts = {key: [(d, b) for d, b in on.items() if b] for key, on in held.items()}

    def helps(resident: ResidentView, remaining: Mapping[str, int]) -> int:
        # most residents sit on one device: walk theirs, not every device that is short
        return sum(min(b, remaining[d]) for d, b in parts[id(resident)] if remaining[d] > 0)

    chosen: list[ResidentView] = []
    taken: set[int] = set()  # by identity: a resident is one object in the snapshot
    remaining = dict(need)
    while any(b > 0 for b in remaining.values()):
        best: ResidentView | None = None
        best_ratio = 0.0
        for resident in pool:
            if id(resident) in taken:
                continue
            freed = helps(resident, remaining)
            if freed <= 0:
                continue
            ratio = freed / price[id(resident)]
            if ratio > best_ratio:
                best, best_ratio = resident, ratio
        if best is None:
            return None
        chosen.append(best)
        taken.add(id(best))
        for device, size in best.holdings():
            if device in remaining:
                remaining[device] -= size

    def covers(victims: list[ResidentView]) -> bool:
        return all(sum(held[id(v)][d] for v in victims) >= b for d, b in need.items())

    for resident in sorted(chosen, key=lambda r: (-price[id(r)], r.key)):
        rest = [v for v in chosen if v is not resident]
        if covers(rest):
            chosen = rest
    chosen.sort(key=lambda r: (r.last_used, r.key))  # stop the longest idle first
    return [Victim(r.key, r.bytes, VictimReason.LEAST_COST, price[id(r)]) for r in chosen]


def over_caps(
    caps: Mapping[str, int], residents: Sequence[ResidentView]
) -> tuple[list[ResidentView], dict[str, int]]:
    """A cap lowered below what residents hold (``/v1/limits``): the idle residents that
    leave so each device fits its cap (the cheapest covering set; all of those that help
    when they cannot cover it), and the bytes still over each cap after them, held by
    residents that serve or are pinned (they are never stopped for it)."""
    held: dict[str, int] = {}
    for r in residents:
        for device, size in r.holdings():
            held[device] = held.get(device, 0) + size
    short = {d: held[d] - cap for d, cap in caps.items() if held.get(d, 0) > cap}
    if not short:
        return [], {}
    candidates = [r for r in residents if r.evictable]
    victims = choose(short, candidates)
    if victims is None:
        leaving = [r for r in candidates if any(r.bytes_on(d) for d in short)]
    else:
        keys = {v.key for v in victims}
        leaving = [r for r in candidates if r.key in keys]
    leaving.sort(key=lambda r: (r.last_used, r.key))
    still = {d: b - sum(r.bytes_on(d) for r in leaving) for d, b in short.items()}
    return leaving, {d: b for d, b in still.items() if b > 0}
