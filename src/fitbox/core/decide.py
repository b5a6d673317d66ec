"""decide(): where a model goes, on which rung, at which window, and who leaves for it.

Pure: a complete ``Snapshot`` and an ``Ask`` in, a ``Place``, ``Wait`` or ``Refuse`` out,
with a named reason for every rung it did not take. FORMULAS.md §Decide walks the same
steps with their rules:

1. candidates: the approved variants in quality order (a pinned quant keeps one); a bad
   artifact is terminal;
2. per variant, rungs in ladder order, per rung the K/V types in preference order;
3. per rung, the devices (one GPU that fits, else the fewest GPUs split by free memory;
   host; or, ``fitting.partial``, one GPU and host with a partial layer count) and the
   window band (``bands.py``);
4. the cheapest eviction that makes room now; the CPU claim;
5. the goal ranks what is admissible; waiting is chosen only when room for a better
   placement is expected within the call's max wait (``conclude.py``).
"""

from __future__ import annotations

from collections.abc import Iterator

from fitbox.core import bands, claims, evict, sizing
from fitbox.core.ask import Ask, Candidate
from fitbox.core.bands import window_ticks
from fitbox.core.conclude import conclude
from fitbox.core.costs import Sizer
from fitbox.core.decision import (
    Band,
    BandKind,
    Decision,
    Place,
    Refuse,
    RefuseReason,
    Rejected,
    RejectReason,
    Victim,
)
from fitbox.core.fitting import need, partial, placement_class, short, windows_for
from fitbox.core.room import Room
from fitbox.core.search import Fit, Option, Refusal, Search
from fitbox.core.split import HOST, Placement
from fitbox.core.types import WEIGHTS_IN_RAM, Goal, Rung, Snapshot

__all__ = ["Room", "Search", "decide", "rung_jobs", "try_kv", "window_ticks"]


def rung_jobs(ask: Ask, goal: Goal) -> Iterator[tuple[int, Candidate, Candidate, Rung]]:
    """(q, ladder owner, artifact loaded, rung) in the order they are tried."""
    candidates = [
        (q, c) for q, c in enumerate(ask.candidates)
        if ask.quant is None or c.quant.upper() == ask.quant.upper()
    ]  # fmt: skip

    def loaded(q: int, owner: Candidate, rung: Rung) -> Candidate | None:
        if rung is not Rung.FOUR_BIT:
            return owner
        if owner.four_bit:
            return None
        return next((c for c in ask.candidates[q + 1 :] if c.four_bit and not c.terminal), None)

    pairs = [(q, owner, rung) for q, owner in candidates for rung in ask.rungs]
    if goal is Goal.FAST:  # time first: every variant's fastest rung before any slower one
        pairs.sort(key=lambda p: (ask.rungs.index(p[2]), p[0]))
    for q, owner, rung in pairs:
        artifact = loaded(q, owner, rung)
        if artifact is None:
            yield q, owner, owner, rung  # reported as skipped
        else:
            yield q, owner, artifact, rung


def _placements(rung: Rung, candidate: Candidate, room: Room) -> Iterator[Placement] | RejectReason:
    """Device sets for a rung, preferred first (partial offload is searched separately)."""
    shape = candidate.shape
    n_all = (shape.n_layer + 1) if shape else 1
    if rung in (Rung.GPU_ONLY, Rung.FOUR_BIT, Rung.MOE_SPLIT):
        if not room.gpus:
            return RejectReason.NO_GPU
        experts = rung is Rung.MOE_SPLIT
        if experts and not candidate.is_moe:
            return RejectReason.NOT_MOE

        def gpu_sets() -> Iterator[Placement]:
            by_room = sorted(room.gpus, key=lambda g: (-room.most[g], room.order[g]))
            # one GPU: best fit first (least room left over), so big holes stay for big models
            for gpu in sorted(room.gpus, key=lambda g: (room.most[g], room.order[g])):
                yield Placement((gpu,), n_all, (), experts)
            if candidate.layout is None:
                return
            for k in range(2, len(room.gpus) + 1):  # fewest GPUs, split by free memory
                chosen = sorted(by_room[:k], key=room.order.__getitem__)  # the engine's order
                shares = tuple(float(max(room.most[g], 1)) for g in chosen)
                yield Placement(tuple(chosen), n_all, shares, experts)

        return gpu_sets()
    if rung is Rung.RAM_ONLY:
        return iter([Placement()]) if room.has_host else RejectReason.NO_GPU
    if not room.gpus:
        return RejectReason.NO_GPU
    if candidate.layout is None:
        return RejectReason.NEEDS_LAYOUT
    return iter(())  # MAX_RAM / MAX_GPU: _partial() searches the layer count


def _fit(search: Search, sizer: Sizer, placement: Placement) -> Fit | Rejected | None:
    """The largest window this placement fits at once every idle resident is gone; or why not
    (``None``: the windows are fine but memory is short: see ``fitting.short``)."""
    windows = windows_for(search, sizer, placement_class(placement, sizer.n_layer))
    if isinstance(windows, tuple):
        reason, detail = windows
        return Rejected(sizer.candidate.key, Rung.GPU_ONLY, "", reason, detail)
    room = search.room

    def fits(i: int) -> bool:
        return room.fits(need(sizer, placement, windows[i]), room.most)

    best = bands.largest(len(windows) - 1, fits)
    if best is None:
        return None
    window = windows[best]
    return Fit(placement, window, need(sizer, placement, window), bands.band(windows, best))


def _seconds(ask: Ask, candidate: Candidate, rung: Rung) -> float | None:
    speeds = candidate.speeds_on(Rung.GPU_ONLY if rung is Rung.FOUR_BIT else rung)
    if speeds is None or speeds.load_seconds is None:
        return None
    total = speeds.load_seconds
    for tokens, ms in ((ask.prompt_tokens, speeds.prompt_ms), (ask.max_tokens, speeds.decode_ms)):
        if tokens:
            if ms is None:
                return None
            total += tokens * ms / 1000
    return total


def try_kv(search: Search, q: int, candidate: Candidate, rung: Rung, type_k: str,
           type_v: str) -> None:  # fmt: skip
    ask, room = search.ask, search.room
    kv = f"{type_k}/{type_v}"
    search.position += 1

    def reject(reason: RejectReason, detail: str) -> None:
        search.rejected.append(Rejected(candidate.key, rung, kv, reason, detail))

    if candidate.shape is not None:
        problem = sizing.kv_type_problem(candidate.shape, type_k, type_v, flash_attn=True)
        if problem:
            reject(RejectReason.KV_TYPE, problem)
            return
    sizer = Sizer(candidate, ask.parallel, type_k, type_v)
    placements = _placements(rung, candidate, room)
    if isinstance(placements, RejectReason):
        reject(placements, {
            RejectReason.NO_GPU: "this box has no GPU" if rung is not Rung.RAM_ONLY
            else "host RAM is not offered", RejectReason.NOT_MOE: "not a mixture-of-experts model",
            RejectReason.NEEDS_LAYOUT: "partial offload needs the per-layer sizes of the file",
        }[placements])  # fmt: skip
        return
    fit: Fit | Rejected | None = None
    first_short: Placement | None = None
    if rung in (Rung.MAX_RAM, Rung.MAX_GPU):
        fit = partial(search, sizer, rung)
        if fit is None:
            first_short = Placement((room.roomiest_gpu(),), 1, (), False)
    else:
        fit, first_short = _first_fit(search, sizer, placements)
    if isinstance(fit, Rejected):
        reject(fit.reason, fit.detail)
        return
    if fit is None:
        assert first_short is not None
        why = short(search, sizer, first_short)
        reject(why.reason, why.detail)
        if why.reason is RejectReason.HELD_BY_BUSY:
            _hope(search, q, candidate, rung, type_k, type_v, sizer, first_short, memory=True)
        return
    _admit(search, q, candidate, rung, type_k, type_v, fit)


def _first_fit(
    search: Search, sizer: Sizer, placements: Iterator[Placement]
) -> tuple[Fit | Rejected | None, Placement | None]:
    """One GPU if any fits (the largest window; then one that needs no eviction; then the
    best fit), else the fewest GPUs that do."""
    room = search.room
    singles: list[Fit] = []
    first_short: Placement | None = None
    for placement in placements:
        if placement.tensor_split and singles:
            break
        attempt = _fit(search, sizer, placement)
        if isinstance(attempt, Rejected):
            return attempt, None
        if attempt is None:
            first_short = first_short or placement
            continue
        if placement.tensor_split:
            return attempt, None
        singles.append(attempt)
    if not singles:
        return None, first_short

    idle = [r for r in search.snapshot.residents if r.evictable]

    def preference(fit: Fit) -> tuple[int, float, int]:
        short = {d: f.total - room.now[d] for d, f in fit.need.items()}
        victims = evict.choose(short, idle) or []
        return (-fit.window, sum(v.cost for v in victims), sum(v.bytes for v in victims))

    return min(singles, key=preference), None


def _hope(search: Search, q: int, candidate: Candidate, rung: Rung, type_k: str, type_v: str,
          sizer: Sizer, placement: Placement, *, memory: bool) -> None:  # fmt: skip
    """A placement possible once busy residents settle: a Wait option."""
    room = search.room
    windows = windows_for(search, sizer, placement_class(placement, sizer.n_layer))
    window = windows[0] if isinstance(windows, list) else 1
    wanted = need(sizer, placement, window)
    lacking = {d for d, f in wanted.items() if f.total > room.most.get(d, -1)}
    blockers = tuple(sorted(
        r.key for r in search.snapshot.residents
        if r.settles and (any(r.bytes_on(d) for d in lacking) if memory else r.cores)
    ))  # fmt: skip
    etas = [r.eta_idle for r in search.snapshot.residents if r.key in blockers]
    eta = max((e for e in etas if e is not None), default=None) if None not in etas else None
    place = _place(candidate, rung, type_k, type_v, Fit(placement, window, wanted,
                   Band(BandKind.POINT, window, window)), (), claims.Claim(()), search)  # fmt: skip
    search.hopeful.append(Option(place, q, search.position, _seconds(search.ask, candidate, rung),
                                 0.0, 0, blockers, eta))  # fmt: skip


def _place(
    candidate: Candidate,
    rung: Rung,
    type_k: str,
    type_v: str,
    fit: Fit,
    victims: tuple[Victim, ...],
    claim: claims.Claim,
    search: Search,
) -> Place:
    gpus = fit.placement.gpus if fit.placement.gpu_layers > 0 else ()
    devices = tuple(gpus) + ((HOST,) if HOST in fit.need or not gpus else ())
    return Place(
        artifact=candidate.key, rung=rung, window=fit.window, type_k=type_k, type_v=type_v,
        devices=devices, footprint=tuple(sorted(fit.need.items())),
        gpu_layers=fit.placement.gpu_layers, tensor_split=fit.placement.tensor_split,
        experts_in_ram=fit.placement.experts_in_ram, victims=victims, cores=claim.cores,
        cores_from=claim.taken_from, band=fit.band,
        predicted_seconds=_seconds(search.ask, candidate, rung),
        where=placement_class(fit.placement, candidate.shape.n_layer if candidate.shape else 0),
    )  # fmt: skip


def _admit(search: Search, q: int, candidate: Candidate, rung: Rung, type_k: str, type_v: str,
           fit: Fit) -> None:  # fmt: skip
    snapshot, room = search.snapshot, search.room
    short = {d: f.total - room.now[d] for d, f in fit.need.items()}
    idle = [r for r in snapshot.residents if r.evictable]
    chosen = evict.choose(short, idle)
    assert chosen is not None, "fits room.most, so the idle residents cover it"
    leaving = {v.key for v in chosen}
    speeds = candidate.speeds_on(rung)
    claim = claims.claim(
        snapshot.cores, snapshot.busy_cores, snapshot.residents, leaving,
        weights_in_ram=rung in WEIGHTS_IN_RAM, floor=search.ask.cpu_floor,
        threads=speeds.threads if speeds else (),
    )  # fmt: skip
    kv = f"{type_k}/{type_v}"
    if claim is None:
        free, idle_cores = claims.claimable(snapshot.cores, snapshot.busy_cores,
                                            snapshot.residents, leaving)  # fmt: skip
        floor = search.ask.cpu_floor if rung in WEIGHTS_IN_RAM else 1
        detail = f"{len(free) + len(idle_cores)} free physical core(s); needs {floor}"
        search.rejected.append(Rejected(candidate.key, rung, kv, RejectReason.NO_CORES, detail))
        if any(r.settles and r.cores for r in snapshot.residents):
            sizer = Sizer(candidate, search.ask.parallel, type_k, type_v)
            _hope(search, q, candidate, rung, type_k, type_v, sizer, fit.placement, memory=False)
        else:
            search.refusals.append(Refusal(RejectReason.NO_CORES, HOST, search.ask.cpu_floor,
                                           len(free) + len(idle_cores)))  # fmt: skip
        return
    by_key = {r.key: r for r in snapshot.residents}
    place = _place(candidate, rung, type_k, type_v, fit, tuple(chosen), claim, search)
    search.options.append(Option(
        place, q, search.position, place.predicted_seconds,
        reload=sum(v.cost for v in chosen),
        hot=sum(1 for v in chosen if by_key[v.key].band > 1),
    ))  # fmt: skip


def decide(snapshot: Snapshot, ask: Ask) -> Decision:
    search = Search(snapshot, ask, Room(snapshot))
    tried = 0
    for q, owner, artifact, rung in rung_jobs(ask, ask.goal):
        if artifact.terminal:
            return Refuse(RefuseReason.BAD_ARTIFACT, 0, 0, detail=artifact.terminal,
                          rejected=tuple(search.rejected))  # fmt: skip
        if rung is Rung.FOUR_BIT and artifact is owner:
            search.rejected.append(Rejected(owner.key, rung, "", RejectReason.NO_FOUR_BIT_VARIANT,
                                   "already 4-bit" if owner.four_bit else
                                   "no approved Q4-class variant"))  # fmt: skip
            continue
        if (
            ask.goal is not Goal.FAST
            and search.options
            and all(o.seconds is not None for o in search.options)
            and q > min(o.q for o in search.options)
        ):
            break  # q ranks first: a lower-quality variant can no longer win
        before = len(search.options)
        for type_k, type_v in ask.kv_types:
            tried += 1
            try_kv(search, q, artifact, rung, type_k, type_v)
            if len(search.options) > before:
                break  # the first K/V type that fits is the one the ladder prefers
        if search.options and search.options[-1].seconds is None:
            break  # ladder order decides from here: the first admissible option wins
    if tried == 0:
        return Refuse(RefuseReason.NO_CANDIDATE, 0, 0,
                      detail="no approved variant or rung is left by the pins and settings",
                      rejected=tuple(search.rejected))  # fmt: skip
    return conclude(search)
