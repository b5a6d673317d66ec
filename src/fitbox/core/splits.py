"""How one set of devices holds one window: the -ts split and the bytes on each device.

A split over GPUs is priced from running sums of each layer's bytes at the window, the
terms ``Sizer.on`` adds up (tests/test_core_parts.py checks they agree to the byte), so a
search can ask many sets without building footprints; the chosen one gets its footprint
from ``fitting.need``. FORMULAS.md §Multi-GPU has the rules.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate

from fitbox.core import bands, split
from fitbox.core.costs import Sizer, SplitCosts
from fitbox.core.decision import RejectReason
from fitbox.core.fitting import need, placement_class
from fitbox.core.room import Room
from fitbox.core.split import HOST, Placement

FILL_STEPS = 16  # bisection steps on the room a layer-count split leaves: 1/65536 of a GPU


@dataclass(frozen=True)
class Held:
    """A set at one window that fits: how it is placed, and its bytes on each device."""

    placement: Placement
    bytes: dict[str, int]


class Splits:
    """Every (device set, window index) of one rung at one K/V type, priced once."""

    def __init__(self, sizer: Sizer, room: Room, windows: list[int], experts: bool) -> None:
        self.sizer, self.room, self.windows, self.experts = sizer, room, windows, experts
        self.n_all = sizer.n_layer + 1 if sizer.candidate.shape else 1
        self.refused: tuple[RejectReason, str] | None = None  # the first refused window met
        self._reach: dict[tuple[str, ...], int] = {}
        self._where: dict[tuple[str, ...], str] = {}
        self._held: dict[tuple[tuple[str, ...], int], Held | None] = {}
        self._costs: dict[int, tuple[SplitCosts, list[int]]] = {}

    def placement(self, gpus: tuple[str, ...], shares: tuple[float, ...] = ()) -> Placement:
        """Every layer and the output on ``gpus`` (-ts ``shares``, else proportional to
        their room); no GPU: host RAM."""
        if not gpus:
            return Placement()
        if len(gpus) > 1 and not shares:
            shares = tuple(float(max(self.room.most[g], 1)) for g in gpus)
        return Placement(gpus, self.n_all, shares, self.experts)

    def where(self, gpus: tuple[str, ...]) -> str:
        """The set's placement class (its shares do not change it)."""
        if gpus not in self._where:
            self._where[gpus] = placement_class(self.placement(gpus), self.sizer.n_layer)
        return self._where[gpus]

    def reach(self, gpus: tuple[str, ...]) -> int:
        """The largest window index this set's placement class may be offered; -1: none."""
        if gpus not in self._reach:
            top = bands.reach(self.windows, self.sizer.candidate, self.where(gpus))
            if isinstance(top, tuple):
                self.refused = self.refused or top
                top = -1
            self._reach[gpus] = top
        return self._reach[gpus]

    def costs(self, i: int) -> tuple[SplitCosts, list[int]]:
        """The split's terms at window ``i``, and the running sum of its layers' bytes."""
        if i not in self._costs:
            terms = self.sizer.layer_costs(self.windows[i], self.experts)
            self._costs[i] = (terms, [0, *accumulate(terms.layers)])
        return self._costs[i]

    def bound(self, k: int, i: int) -> int:
        """GPU bytes any k-GPU split needs at window ``i``: the same layers, caches and one
        compute buffer per GPU whichever GPUs they are, so a set with less room in all
        cannot hold it (a test that costs no pricing)."""
        terms, before = self.costs(i)
        return before[-1] + terms.output + k * terms.compute

    def held(self, gpus: tuple[str, ...], i: int) -> Held | None:
        """How ``gpus`` hold window ``i``, if they do: -ts proportional to room, else by the
        layer counts that leave the most room on the tightest GPU."""
        key = (gpus, i)
        if key not in self._held:
            found = None
            if i <= self.reach(gpus):
                found = self._price(self.placement(gpus), i)
                if found is None and len(gpus) > 1 and self.sizer.candidate.layout is not None:
                    shares = self._fill(gpus, i)
                    found = self._price(self.placement(gpus, shares), i) if shares else None
            self._held[key] = found
        return self._held[key]

    def _price(self, p: Placement, i: int) -> Held | None:
        """``p`` at window ``i``, when the room holds it. A GPU that would take no layer
        makes it no set of that many GPUs: the smaller set stands for it."""
        candidate, sizer = self.sizer.candidate, self.sizer
        fast = p.gpus and candidate.layout is not None and candidate.shape is not None
        where = self.where(p.gpus)
        if fast and candidate.measured_fit(where, self.windows[i], sizer.type_k, sizer.type_v):
            fast = False  # a measured footprint replaces the estimate: price it whole
        if fast:
            totals = self._totals(p, i)
        else:
            totals = {d: f.total for d, f in need(sizer, p, self.windows[i]).items()}
        whole = p.gpu_layers <= 0 or all(g in totals for g in p.gpus)
        most = self.room.most
        fits = all(d in most and b <= most[d] for d, b in totals.items())
        return Held(p, totals) if whole and fits else None

    def _totals(self, p: Placement, i: int) -> dict[str, int]:
        """Bytes per device of ``p`` (every layer on GPUs), as ``Sizer.on`` totals them."""
        terms, before = self.costs(i)
        ranges, last = split.layer_ranges(self.sizer.n_layer, p)
        totals = {HOST: terms.host}
        for device, first, past in ranges:
            totals[device] = before[past] - before[first] + terms.compute
        totals[last] = totals.get(last, terms.compute) + terms.output
        return totals

    def _fill(self, gpus: tuple[str, ...], i: int) -> tuple[float, ...] | None:
        """Layer counts per GPU, in order: each takes what fits once ``spare`` bytes stay
        free on it (the last one the output layer too, each one layer at least); the largest
        ``spare`` that still places every layer, by bisection."""
        terms, before = self.costs(i)
        n_layer, most = len(terms.layers), self.room.most

        def counts(spare: int) -> tuple[float, ...] | None:
            taken, start = [], 0
            for j, g in enumerate(gpus[:-1]):
                room = most[g] - spare - terms.compute
                stop = min(
                    bisect_right(before, before[start] + room) - 1, n_layer - (len(gpus) - 2 - j)
                )
                if stop <= start:
                    return None
                taken.append(float(stop - start))
                start = stop
            last = before[-1] - before[start] + terms.output + terms.compute
            if last > most[gpus[-1]] - spare:
                return None
            return (*taken, float(n_layer - start + 1))

        best = counts(0)
        low, high = 0, min(most[g] for g in gpus)
        for _ in range(FILL_STEPS if best else 0):
            mid = (low + high + 1) // 2
            found = counts(mid)
            low, high, best = (mid, high, found) if found else (low, mid - 1, best)
        return best
