"""CPU claims: each engine gets cores of its own (FORMULAS.md §CPU claims).

- One core stays for fitbox and the OS (the lowest-numbered one, when there are two or more).
  It is *lent* to an engine reading weights from RAM that is alone on the box (no other
  engine holds cores), so that engine runs as many threads as llama-server started by hand
  would; a later claim never takes it (two engines never share a core). Not when an
  operator capped the cores engines claim (--cpu-max): the cap stands.
- Cores held by busy or loading engines are never claimed: two engines never share a core.
- An idle engine's cores can be taken (it is told, in ``Claim.taken_from``, and re-pinned to
  what it keeps).
- Cores kept busy by other work (a sustained reading, box/sensors.py) are taken last: a
  claim short of its need because other work keeps cores busy shrinks to the cores that
  are not (llama.cpp's threads on a core another process computes on wait on each other's
  spin barriers: a 1-token chat took 290-400 ms at -t 2 on two busy cores, 30-60 ms at
  -t 1); only when no other core is left does it take one busy core (one thread), one no
  engine holds before an idle engine's. Foreign work is not an engine: a model is never
  refused, nor made to wait, because something else computes.
- A GPU-only engine gets one core. An engine reading weights from RAM gets as many as still
  make it faster: from its measured bandwidth curve when it reaches that many cores (the
  fewest within 1 % of the best measured rate), else every free core; at least ``floor``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, replace

from fitbox.core.types import ResidentView

GOOD_ENOUGH = 0.99  # within 1 % of the best measured rate: the parity bar (issue 14)
RESERVED_CORES = 1  # the lowest-numbered core stays for fitbox and the OS


@dataclass(frozen=True)
class Claim:
    cores: tuple[int, ...]
    taken_from: tuple[str, ...] = ()


def reserved_core(cores: Collection[int]) -> int | None:
    """The core no engine claims; none on a one-core box, where engines need that core."""
    return min(cores) if len(cores) > RESERVED_CORES else None


def claimable_count(cores: Collection[int]) -> int:
    """How many of ``cores`` engines may claim: the cores tier's device figure."""
    return len(cores) - (0 if reserved_core(cores) is None else RESERVED_CORES)


def claim_pool(cores: Iterable[int], cpu_max: int | None) -> tuple[int, ...]:
    """The cores claims are made from, lowest first: ``cpu_max`` (the cores tier) counts
    the ones engines may claim, so the reserved core comes on top of it."""
    ordered = sorted(cores)
    return tuple(ordered if cpu_max is None else ordered[: cpu_max + RESERVED_CORES])


def _holders(
    residents: Sequence[ResidentView], leaving: Collection[str]
) -> dict[int, ResidentView]:
    held: dict[int, ResidentView] = {}
    for r in residents:
        if r.key not in leaving:
            for core in r.cores:
                held[core] = r
    return held


def claimable(
    cores: Sequence[int],
    busy_cores: Collection[int],
    residents: Sequence[ResidentView],
    leaving: Collection[str],
) -> tuple[list[int], list[tuple[int, str]]]:
    """(free cores, [(core, idle resident holding it)]); residents in ``leaving`` hold none.
    Cores busy with other work are in neither list (see :func:`foreign_busy`)."""
    keep = reserved_core(cores)
    held = _holders(residents, leaving)
    free, idle = [], []
    for core in sorted(cores):
        if core == keep or core in busy_cores:
            continue
        holder = held.get(core)
        if holder is None:
            free.append(core)
        elif holder.idle:
            idle.append((core, holder.key))
    return free, idle


def foreign_busy(
    cores: Sequence[int],
    busy_cores: Collection[int],
    residents: Sequence[ResidentView],
    leaving: Collection[str],
) -> list[tuple[int, str | None]]:
    """Cores busy with other work that no busy or loading engine holds, each with the idle
    engine holding it (None: no engine): claimed last, only to reach a need, the ones no
    engine holds first. An idle engine's busy core is taken as its other cores are (it is
    told), or a snapshot where other work shares an idle engine's cores would refuse a
    model that evicting that idle engine would have placed."""
    keep, held = reserved_core(cores), _holders(residents, leaving)
    found = [
        (c, held[c].key if c in held else None)
        for c in sorted(cores)
        if c in busy_cores and c != keep and (c not in held or held[c].idle)
    ]
    return sorted(found, key=lambda f: (f[1] is not None, f[0]))


def lendable(
    cores: Sequence[int],
    busy_cores: Collection[int],
    residents: Sequence[ResidentView],
    leaving: Collection[str],
) -> int | None:
    """The reserved core, when it may be lent: no other engine holds a core (the box is
    otherwise idle) and no other work keeps it busy."""
    keep = reserved_core(cores)
    if keep is None or keep in busy_cores or _holders(residents, leaving):
        return None
    return keep


def wanted(threads: Sequence[tuple[int, float]], available: int) -> int:
    """How many cores make a RAM-bound engine faster, from its measured curve. A curve that
    never saw this many cores cannot say more would not help: then every available one."""
    usable = [(n, rate) for n, rate in threads if 0 < n <= available]
    if not usable or max(n for n, _ in threads) < available:
        return available
    best = max(rate for _, rate in usable)
    return min(n for n, rate in usable if rate >= GOOD_ENOUGH * best)


def claim(
    cores: Sequence[int],
    busy_cores: Collection[int],
    residents: Sequence[ResidentView],
    leaving: Collection[str],
    *,
    weights_in_ram: bool,
    floor: int,
    threads: Sequence[tuple[int, float]] = (),
    lend: bool = True,
) -> Claim | None:
    """The cores a new engine gets, or None when our own engines hold what it needs (it
    waits for them, or is refused when they are pinned). ``lend`` False: an operator capped
    the cores engines claim (--cpu-max), or the box is not known quiet: the reserved core is
    not lent. Short of its need only because other work keeps cores busy, the claim shrinks
    to the cores that are not, or to one busy core when none is left."""
    if not cores:
        return Claim(())  # the shell did not say: no claims are made
    free, idle = claimable(cores, busy_cores, residents, leaving)
    lent = lendable(cores, busy_cores, residents, leaving) if weights_in_ram and lend else None
    if lent is not None:
        free.append(lent)  # last of the free ones: a smaller claim leaves the OS its core
    foreign = foreign_busy(cores, busy_cores, residents, leaving)
    available = len(free) + len(idle)
    need = max(floor, 1) if weights_in_ram else 1
    if available + len(foreign) < need:
        return None
    count = max(need, wanted(threads, available)) if weights_in_ram else 1
    count = min(count, available) if available else 1  # shrunk to the cores not kept busy
    picked = free[:count]
    taken = idle[: max(count - len(picked), 0)]
    crowded = foreign[: max(count - len(picked) - len(taken), 0)]
    return Claim(
        tuple(sorted(picked + [core for core, _ in taken] + [core for core, _ in crowded])),
        tuple(sorted({key for _, key in taken} | {holder for _, holder in crowded if holder})),
    )


def widened(
    cores: Sequence[int],
    busy_cores: Collection[int],
    residents: Sequence[ResidentView],
    key: str,
    running: int,
    *,
    floor: int,
    threads: Sequence[tuple[int, float]] = (),
    lend: bool = True,
) -> tuple[int, ...] | None:
    """The larger claim an idle engine with weights in RAM (``key``, launched on ``running``
    threads while other work ran or another engine held cores) would get now, or None.
    Only free cores and the lent one count: widening never takes an engine's cores nor
    crowds other work (its ``-t`` is fixed at launch: more cores cost a relaunch,
    box/warmth.py)."""
    kept = [r if r.key == key else replace(r, calls=max(r.calls, 1)) for r in residents]
    found = claim(
        cores, busy_cores, kept, {key}, weights_in_ram=True, floor=floor, threads=threads, lend=lend
    )
    if found is None or len(found.cores) <= running:
        return None
    if set(found.cores) & (set(_holders(residents, {key})) | set(busy_cores)):
        return None
    return found.cores
