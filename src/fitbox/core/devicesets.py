"""Which devices a rung uses: the device sets tried, and the window first.

FORMULAS.md §Multi-GPU has the rule: the largest window up to the preferred one that any
set holds wins; among the sets that hold it, the fewest devices, then the cheapest
eviction, then on one GPU the best fit and in a split the most room left on its tightest
device. Sets are tried fewest devices first, each only at the window that would beat the
best so far, so the wider search costs a few pricings more than "the first set that fits".
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

from fitbox.core import bands, evict
from fitbox.core.costs import Sizer
from fitbox.core.decision import CountReason, DeviceCount, Rejected, Victim
from fitbox.core.fitting import need
from fitbox.core.room import Room
from fitbox.core.search import Fit, Search
from fitbox.core.split import Placement
from fitbox.core.splits import Held, Splits
from fitbox.core.types import Rung

GpuSets = list[list[tuple[str, ...]]]  # index k - 1: the sets of k GPUs tried, in order


def gpu_sets(room: Room) -> tuple[GpuSets, GpuSets]:
    """(the sets tried first, the sets tried only when none of those holds a window).

    One GPU: each, best fit first (least room left over, so big holes stay for big models).
    k GPUs: the k with the most room once idle residents leave, and the k with the most room
    free now (a set that evicts nothing). Then, for each GPU that could come last in the
    engine's order (the last GPU takes the output layer, which can outweigh several
    layers), the k - 1 with the most room before it."""
    order = room.order
    first: GpuSets = [[(g,) for g in sorted(room.gpus, key=lambda g: (room.most[g], order[g]))]]
    then: GpuSets = [[]]

    def engine_order(gpus: list[str]) -> tuple[str, ...]:
        return tuple(sorted(gpus, key=order.__getitem__))

    def most_room(sets: dict[tuple[str, ...], None]) -> list[tuple[str, ...]]:
        return sorted(sets, key=lambda s: (-sum(room.most[g] for g in s), [order[g] for g in s]))

    def by(pool: dict[str, int], gpus: list[str]) -> list[str]:
        return sorted(gpus, key=lambda g: (-pool[g], order[g]))

    by_most, by_now = by(room.most, room.gpus), by(room.now, room.gpus)
    before = [by(room.most, room.gpus[:last]) for last in range(len(room.gpus))]
    for k in range(2, len(room.gpus) + 1):
        tops = dict.fromkeys(engine_order(ranked[:k]) for ranked in (by_most, by_now))
        lasts: dict[tuple[str, ...], None] = {}
        for last in range(k - 1, len(room.gpus)):
            lasts[engine_order([*before[last][: k - 1], room.gpus[last]])] = None
        first.append(most_room(tops))
        then.append(most_room({s: None for s in lasts if s not in tops}))
    return first, then


class SetSearch:
    """The rule over one rung's device sets at one K/V type (``Splits`` prices them)."""

    def __init__(self, search: Search, splits: Splits, sets: tuple[GpuSets, GpuSets]) -> None:
        self.splits, self.room = splits, search.room
        self.sets, self.then = sets
        self.top = len(splits.windows) - 1
        self.idle = [r for r in search.snapshot.residents if r.evictable]
        self._victims: dict[tuple[tuple[str, ...], int], list[Victim]] = {}

    def holds(self, gpus: tuple[str, ...], i: int) -> bool:
        return self.splits.held(gpus, i) is not None

    def room_of(self, gpus: tuple[str, ...]) -> int:
        return sum(self.room.most[g] for g in gpus)

    def within(self, k: int, i: int) -> Iterator[tuple[str, ...]]:
        """The k-GPU sets with room enough for window ``i``, most room first; the fallback
        sets only when none of the first ones holds it."""
        if k == 1:
            yield from self.sets[0]
            return
        bound = self.splits.bound(k, i)
        for sets in (self.sets[k - 1], self.then[k - 1]):
            if sets is self.then[k - 1] and any(self.holds(g, i) for g in self.sets[k - 1]):
                return
            for gpus in sets:
                if self.room_of(gpus) < bound:
                    break  # sorted by room: none after it has more
                yield gpus

    def best(self) -> tuple[int, int] | None:
        """(device count, window index) of the rule's winner: the largest window first, the
        fewest devices next. Each set is priced once at the window that would beat the best
        so far, then climbed by bisection only when it does."""
        best_k, best_i = 0, -1
        for k in range(1, len(self.sets) + 1):
            if best_i == self.top:
                break  # more devices cannot beat the preferred window
            for gpus in self.within(k, best_i + 1):
                if not self.holds(gpus, best_i + 1):
                    continue
                climbed = bands.largest(self.top, partial(self.holds, gpus), best_i + 2)
                best_k, best_i = k, best_i + 1 if climbed is None else climbed
                if best_i == self.top:
                    break
        return (best_k, best_i) if best_i >= 0 else None

    def victims(self, gpus: tuple[str, ...], i: int) -> list[Victim]:
        """Who leaves for ``gpus`` to hold window ``i`` (which it does)."""
        key = (gpus, i)
        if key not in self._victims:
            held = self.splits.held(gpus, i)
            assert held is not None
            lacking = {d: b - self.room.now[d] for d, b in held.bytes.items()}
            chosen = evict.choose(lacking, self.idle)
            assert chosen is not None, "fits room.most, so the idle residents cover it"
            self._victims[key] = chosen
        return self._victims[key]

    def pick(self, k: int, i: int) -> Held:
        """Among the k-GPU sets that hold window ``i``: the cheapest eviction, then one GPU's
        best fit (the order tried) or a split's most room left on its tightest GPU. A set
        that fits the room free now evicts nothing and beats every set that must evict, so
        eviction is priced only when no set fits as is."""
        best: tuple[tuple[float, ...], Held] | None = None
        evicting: list[tuple[int, tuple[str, ...], Held]] = []
        for index, gpus in enumerate(self.within(k, i)):
            # nothing leaves for the best so far: only room left can beat it, and the
            # tightest GPU of a set has at most the set's mean room left (most room first)
            if best is not None and (k == 1 or self.spare(gpus, i) <= -best[0][2]):
                break
            held = self.splits.held(gpus, i)
            if held is None:
                continue
            if any(b > self.room.now[d] for d, b in held.bytes.items()):
                evicting.append((index, gpus, held))
                continue
            key = (0.0, 0.0, 0 if k == 1 else -self.left(gpus, held), index)
            if best is None or key < best[0]:
                best = (key, held)
        if best is not None:
            return best[1]
        for index, gpus, held in evicting:
            victims = self.victims(gpus, i)
            key = (
                sum(v.cost for v in victims),
                sum(v.bytes for v in victims),
                0 if k == 1 else -self.left(gpus, held),
                index,
            )
            if best is None or key < best[0]:
                best = (key, held)
        assert best is not None, "best() found a set of k GPUs that holds window i"
        return best[1]

    def left(self, gpus: tuple[str, ...], held: Held) -> int:
        """Room a split leaves on its tightest GPU once idle residents are gone."""
        return min(self.room.most[g] - held.bytes[g] for g in gpus)

    def spare(self, gpus: tuple[str, ...], i: int) -> int:
        """The most room a split over ``gpus`` can leave on its tightest GPU: the mean."""
        return (self.room_of(gpus) - self.splits.bound(len(gpus), i)) // len(gpus)

    def any_holds(self, k: int, i: int) -> bool:
        return any(self.holds(gpus, i) for gpus in self.within(k, i))

    def counts(self, chosen: Held, k_chosen: int, i_chosen: int) -> tuple[DeviceCount, ...]:
        """The window each device count would have given, and why it was not placed."""
        rows = []
        for k in range(1, len(self.sets) + 1):
            found: Held | None = chosen
            i = i_chosen
            if k != k_chosen:  # fewer GPUs hold less than the chosen, more at most as much
                holds = partial(self.any_holds, k)
                same = k > k_chosen and holds(i_chosen)
                top = i_chosen if same else bands.largest(i_chosen - 1, holds)
                found = None if top is None else self.pick(k, top)  # the rule's set of k
                i = -1 if top is None else top
            if found is None:
                rows.append(DeviceCount(k, (), 0, (), CountReason.NO_WINDOW))
                continue
            reason = (
                CountReason.CHOSEN
                if k == k_chosen
                else CountReason.SMALLER_WINDOW
                if i < i_chosen
                else CountReason.MORE_DEVICES
            )
            gpus = found.placement.gpus
            leaving = tuple(v.key for v in self.victims(gpus, i))
            rows.append(DeviceCount(k, gpus, self.splits.windows[i], leaving, reason))
        return tuple(rows)


def place_on_sets(
    search: Search,
    sizer: Sizer,
    sets: tuple[GpuSets, GpuSets],
    *,
    experts: bool = False,
    counts: bool = False,
) -> tuple[Fit | Rejected | None, Placement | None]:
    """The rule's winner among ``sets`` (``gpu_sets``; ``([[()]], [[]])``: host RAM alone);
    or why none holds the window the call needs (a Rejected), or the set to explain a
    shortfall by."""
    windows = bands.band_windows(search.ask, sizer.candidate)
    key = sizer.candidate.key
    if isinstance(windows, tuple):
        return Rejected(key, Rung.GPU_ONLY, "", *windows), None
    splits = Splits(sizer, search.room, windows, experts)
    finder = SetSearch(search, splits, sets)
    found = finder.best()
    if found is None:
        first = _explained_by(search, sizer, splits, windows[0], sets[0])
        if first is None and splits.refused is not None:
            return Rejected(key, Rung.GPU_ONLY, "", *splits.refused), None
        return None, splits.placement(sets[0][0][0] if first is None else first)
    k, i = found
    chosen = finder.pick(k, i)
    placement = chosen.placement
    fit = Fit(placement, windows[i], need(sizer, placement, windows[i]), bands.band(windows, i))
    if counts:
        fit.counts = lambda: finder.counts(chosen, k, i)
    return fit, None


def _explained_by(
    search: Search, sizer: Sizer, splits: Splits, window: int, sets: GpuSets
) -> tuple[str, ...] | None:
    """The set a miss is explained by: the first offered one that would hold the model were
    its devices empty (what holds them then says why: busy residents that settle, pinned
    ones), else the first offered one (the box is too small for it). Explaining by the
    roomiest set now would call a model larger than the box that a settling resident only
    keeps off another device for now."""
    offered = [g for row in sets for g in row if splits.reach(g) >= 0]
    for gpus in offered:
        wanted = need(sizer, splits.placement(gpus), window)
        devices = {d.id: d.capacity for d in search.snapshot.devices}
        if all(f.total <= devices.get(d, 0) for d, f in wanted.items()):
            return gpus
    return offered[0] if offered else None
