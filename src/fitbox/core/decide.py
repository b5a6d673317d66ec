"""decide(): where a model goes, on which rung, at which window, and who leaves for it.

Pure: a complete ``Snapshot`` and an ``Ask`` in, a ``Place``, ``Wait`` or ``Refuse`` out,
with a named reason for every rung it did not take. FORMULAS.md §Decide walks the same
steps with their rules:

1. candidates: the approved variants in quality order (a pinned quant keeps one); a bad
   artifact is terminal;
2. per variant, rungs in ladder order, per rung the K/V types in preference order;
3. per rung, the devices (one GPU that fits, else the fewest GPUs split by free memory;
   host; or one GPU and host with a partial layer count) and the window band;
4. the cheapest eviction that makes room now; the CPU claim;
5. the goal ranks what is admissible; waiting is chosen only when room for a better
   placement is expected within the call's max wait.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from fitbox.core import claims, evict, repack, sizing, split
from fitbox.core.ask import Ask, Candidate
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
    Wait,
    WaitReason,
)
from fitbox.core.split import HOST, Placement
from fitbox.core.types import (
    WEIGHTS_IN_RAM,
    DeviceKind,
    Footprint,
    Goal,
    Rung,
    Snapshot,
)

WINDOW_BASE = 512


def window_ticks(low: int, high: int) -> list[int]:
    """The ladder 512, 768, 1024, 1536, 2048, ... (x2 and x1.5 steps) within [low, high],
    with ``high`` itself added: the windows fitbox loads at."""
    ticks, step = [], WINDOW_BASE
    while step <= high:
        for tick in (step, step * 3 // 2):
            if low <= tick <= high:
                ticks.append(tick)
        step *= 2
    if high >= low and (not ticks or ticks[-1] != high):
        ticks.append(high)
    return sorted(set(ticks))


def smallest_tick_at_least(n: int) -> int:
    step = WINDOW_BASE
    while True:
        for tick in (step, step * 3 // 2):
            if tick >= n:
                return tick
        step *= 2


class Room:
    """Bytes per device: free now, free after every idle resident left, free after every
    unpinned resident settled and left, and free on an empty device."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        reserved: dict[str, int] = {}
        for promise in snapshot.reservations:
            reserved[promise.device] = reserved.get(promise.device, 0) + promise.bytes
        self.empty = {d.id: d.capacity - reserved.get(d.id, 0) for d in snapshot.devices}
        self.now = dict(self.empty)
        self.most = dict(self.empty)
        self.hopeful = dict(self.empty)
        for r in snapshot.residents:
            for device, held in r.holdings():
                if device not in self.now:
                    continue
                self.now[device] -= held
                if not r.evictable:
                    self.most[device] -= held
                if not (r.evictable or r.settles):
                    self.hopeful[device] -= held
        self.gpus = sorted(d.id for d in snapshot.devices if d.kind is DeviceKind.GPU)
        self.has_host = HOST in self.empty

    def fits(self, need: dict[str, Footprint], pool: dict[str, int]) -> bool:
        return all(d in pool and f.total <= pool[d] for d, f in need.items())


@dataclass
class Option:
    place: Place
    q: int
    position: int  # order of evaluation: the ladder order
    seconds: float | None  # T
    reload: float  # R: cost of the residents displaced
    hot: int  # E_hot: high-priority residents displaced
    blockers: tuple[str, ...] = ()  # a hopeful option: who must settle first
    eta: float | None = None  # hopeful: when they are expected to settle


@dataclass(frozen=True)
class Refusal:
    reason: RejectReason
    device: str
    needed: int
    available: int
    holders: tuple[str, ...] = ()
    footprint: Footprint | None = None
    window: int = 0


@dataclass
class Search:
    snapshot: Snapshot
    ask: Ask
    room: Room
    options: list[Option] = field(default_factory=list)
    hopeful: list[Option] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    position: int = 0


# -- rungs -----------------------------------------------------------------------------


def _rung_jobs(ask: Ask, goal: Goal) -> Iterator[tuple[int, Candidate, Candidate, Rung]]:
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
            by_room = sorted(room.gpus, key=lambda g: (-room.most[g], g))
            # one GPU: best fit first (least room left over), so big holes stay for big models
            for gpu in sorted(room.gpus, key=lambda g: (room.most[g], g)):
                yield Placement((gpu,), n_all, (), experts)
            if candidate.layout is None:
                return
            for k in range(2, len(room.gpus) + 1):  # fewest GPUs, split by free memory
                chosen = sorted(by_room[:k])
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


# -- fitting one placement ----------------------------------------------------------------


@dataclass
class Fit:
    placement: Placement
    window: int
    need: dict[str, Footprint]
    band: Band


def placement_class(placement: Placement, n_layer: int) -> str:
    """What measured facts (footprints, refused windows) are filed under: the device of a
    whole-model placement, else its devices joined with ``+`` (``gpu0+host``)."""
    if not placement.gpus or placement.gpu_layers <= 0:
        return HOST
    where = "+".join(placement.gpus)
    if placement.gpu_layers < n_layer + 1 or placement.experts_in_ram:
        where += f"+{HOST}"
    return where


def _need(sizer: Sizer, placement: Placement, window: int) -> dict[str, Footprint]:
    need = sizer.on(placement, window)
    where = placement_class(placement, sizer.n_layer)
    measured = sizer.candidate.measured_fit(where, window, sizer.type_k, sizer.type_v)
    if measured is not None:
        need[where] = measured
    return need


def _band(windows: list[int], fits: Callable[[int], bool]) -> tuple[int | None, Band]:
    """The largest window that fits, by bisection (need grows with the window)."""
    low, high, best = 0, len(windows) - 1, None
    while low <= high:
        mid = (low + high) // 2
        if fits(windows[mid]):
            best, low = mid, mid + 1
        else:
            high = mid - 1
    if best is None:
        return None, Band(BandKind.INFEASIBLE, windows[0], 0)
    kind = BandKind.POINT if best == 0 else BandKind.RANGE
    return windows[best], Band(kind, windows[0], windows[best])


def _windows(search: Search, sizer: Sizer, where: str) -> list[int] | tuple[RejectReason, str]:
    ask, shape = search.ask, sizer.candidate.shape
    needed = max(ask.need, 1) * max(ask.parallel, 1)
    trained = shape.n_ctx_train if shape and shape.n_ctx_train > 0 else None
    if trained is not None and needed > trained:
        return (RejectReason.BEYOND_TRAINING,
                f"the call needs {needed} tokens of window; trained on {trained}")  # fmt: skip
    low = smallest_tick_at_least(needed)
    high = max(ask.window, low)
    if trained is not None:
        low, high = min(low, trained), min(high, trained)
    cap = sizer.candidate.window_cap(where)
    if cap is not None:
        if low >= cap:
            return (RejectReason.REFUSED_WINDOW,
                    f"a load at {cap} tokens failed on {where}; the call needs {low}")  # fmt: skip
        high = min(high, max(t for t in window_ticks(low, cap) if t < cap))
    return window_ticks(low, high)


def _fit(search: Search, sizer: Sizer, placement: Placement) -> Fit | Rejected | None:
    """The largest window this placement fits at once every idle resident is gone; or why not
    (``None``: the windows are fine but memory is short: see ``_short``)."""
    windows = _windows(search, sizer, placement_class(placement, sizer.n_layer))
    if isinstance(windows, tuple):
        reason, detail = windows
        return Rejected(sizer.candidate.key, Rung.GPU_ONLY, "", reason, detail)
    room = search.room
    window, band = _band(windows, lambda w: room.fits(_need(sizer, placement, w), room.most))
    if window is None:
        return None
    return Fit(placement, window, _need(sizer, placement, window), band)


def _partial(search: Search, sizer: Sizer, rung: Rung) -> Fit | Rejected | None:
    """max-gpu: the most layers one GPU holds; max-ram: the fewest it must (host holds the
    rest). Host need falls and GPU need grows with the layer count, so both bisect."""
    room = search.room
    gpu = sorted(room.gpus, key=lambda g: (-room.most[g], g))[0]
    n_layer = sizer.n_layer
    windows = _windows(search, sizer, placement_class(Placement((gpu,), 1), n_layer))
    if isinstance(windows, tuple):
        return Rejected(sizer.candidate.key, rung, "", *windows)

    def at(layers: int) -> Placement:
        return Placement((gpu,), layers, (), False)

    def gpu_ok(layers: int, window: int) -> bool:
        need = _need(sizer, at(layers), window)
        return need.get(gpu, Footprint(0, 0, 0, 0)).total <= room.most[gpu]

    def host_ok(layers: int, window: int) -> bool:
        need = _need(sizer, at(layers), window)
        return need.get(HOST, Footprint(0, 0, 0, 0)).total <= room.most.get(HOST, -1)

    def layers_for(window: int) -> int | None:
        lo, hi, most_gpu = 1, n_layer, None  # the most layers the GPU holds
        while lo <= hi:
            mid = (lo + hi) // 2
            if gpu_ok(mid, window):
                most_gpu, lo = mid, mid + 1
            else:
                hi = mid - 1
        lo, hi, least_gpu = 1, n_layer, None  # the fewest the host can spare
        while lo <= hi:
            mid = (lo + hi) // 2
            if host_ok(mid, window):
                least_gpu, hi = mid, mid - 1
            else:
                lo = mid + 1
        if most_gpu is None or least_gpu is None or least_gpu > most_gpu:
            return None
        return most_gpu if rung is Rung.MAX_GPU else least_gpu

    window, band = _band(windows, lambda w: layers_for(w) is not None)
    if window is None:
        return None
    layers = layers_for(window)
    assert layers is not None
    placement = at(layers)
    return Fit(placement, window, _need(sizer, placement, window), band)


def _short(search: Search, sizer: Sizer, placement: Placement) -> Rejected:
    """Why a placement cannot fit at its smallest window, recorded with its numbers."""
    room, candidate = search.room, sizer.candidate
    windows = _windows(search, sizer, placement_class(placement, sizer.n_layer))
    window = windows[0] if isinstance(windows, list) else 1
    need = _need(sizer, placement, window)
    kv = f"{sizer.type_k}/{sizer.type_v}"
    for device, footprint in need.items():
        if footprint.total > room.empty.get(device, -1):
            empty = room.empty.get(device, 0)
            search.refusals.append(Refusal(RejectReason.LARGER_THAN_BOX, device, footprint.total,
                                           empty, (), footprint, window))  # fmt: skip
            return Rejected(candidate.key, Rung.GPU_ONLY, kv, RejectReason.LARGER_THAN_BOX,
                            f"needs {footprint.total} B on {device} at {window} tokens; an "
                            f"empty {device} holds {room.empty.get(device, 0)} B")  # fmt: skip
    short = [d for d, f in need.items() if f.total > room.most[d]]
    if not short:  # partial offload: each side fits alone, no layer count fits both
        return Rejected(candidate.key, Rung.GPU_ONLY, kv, RejectReason.WINDOW_INFEASIBLE,
                        "no layer count fits both the GPU and the host")  # fmt: skip
    device = short[0]
    if room.fits(need, room.hopeful):
        return Rejected(candidate.key, Rung.GPU_ONLY, kv, RejectReason.HELD_BY_BUSY,
                        f"needs {need[device].total} B on {device}; {room.most[device]} B "
                        "free once idle models leave; busy models hold the rest")  # fmt: skip
    holders = tuple(sorted(r.key for r in search.snapshot.residents
                           if r.pinned and any(r.bytes_on(d) for d in short)))  # fmt: skip
    search.refusals.append(Refusal(RejectReason.HELD_BY_PINNED, device, need[device].total,
                                   room.most[device], holders, need[device], window))  # fmt: skip
    detail = f"needs {need[device].total} B on {device}; pinned models hold the room"
    return Rejected(candidate.key, Rung.GPU_ONLY, kv, RejectReason.HELD_BY_PINNED, detail)


# -- one rung, whole -------------------------------------------------------------------


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


def _try(search: Search, q: int, candidate: Candidate, rung: Rung, type_k: str,
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
        fit = _partial(search, sizer, rung)
        if fit is None:
            first_short = Placement((sorted(room.gpus, key=lambda g: (-room.most[g], g))[0],),
                                    1, (), False)  # fmt: skip
    else:
        fit, first_short = _first_fit(search, sizer, placements)
    if isinstance(fit, Rejected):
        reject(fit.reason, fit.detail)
        return
    if fit is None:
        assert first_short is not None
        why = _short(search, sizer, first_short)
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
    windows = _windows(search, sizer, placement_class(placement, sizer.n_layer))
    window = windows[0] if isinstance(windows, list) else 1
    need = _need(sizer, placement, window)
    short = {d for d, f in need.items() if f.total > room.most.get(d, -1)}
    blockers = tuple(sorted(
        r.key for r in search.snapshot.residents
        if r.settles and (any(r.bytes_on(d) for d in short) if memory else r.cores)
    ))  # fmt: skip
    etas = [r.eta_idle for r in search.snapshot.residents if r.key in blockers]
    eta = max((e for e in etas if e is not None), default=None) if None not in etas else None
    place = _place(candidate, rung, type_k, type_v, Fit(placement, window, need,
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
        where=placement_class(fit.placement, candidate.shape.n_layer if candidate.shape else 0)
        + repack.placement_suffix(candidate),  # repack hook 2/2: facts of --no-repack apart
        repack=split.repack_reason(candidate, fit.placement),
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


# -- ranking ----------------------------------------------------------------------------


def _rank(goal: Goal, timed: bool) -> Callable[[Option], tuple[float, ...]]:
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


def decide(snapshot: Snapshot, ask: Ask) -> Decision:
    room = Room(snapshot)
    search = Search(snapshot, ask, room)
    tried = 0
    for q, owner, artifact, rung in _rung_jobs(ask, ask.goal):
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
            _try(search, q, artifact, rung, type_k, type_v)
            # repack hook 1/2 (core/repack.py): RAM kept the repacked copy out: --no-repack
            plain = repack.without(artifact, rung, search.rejected, len(search.options) > before)
            if plain is not None:
                _try(search, q, plain, rung, type_k, type_v)
            if len(search.options) > before:
                break  # the first K/V type that fits is the one the ladder prefers
        if search.options and search.options[-1].seconds is None:
            break  # ladder order decides from here: the first admissible option wins
    if tried == 0:
        return Refuse(RefuseReason.NO_CANDIDATE, 0, 0,
                      detail="no approved variant or rung is left by the pins and settings",
                      rejected=tuple(search.rejected))  # fmt: skip
    return _conclude(search)


def _conclude(search: Search) -> Decision:
    ask = search.ask
    every = search.options + search.hopeful
    timed = all(o.seconds is not None for o in every)
    key = _rank(ask.goal, timed)
    if search.options:
        best = min(search.options, key=key)
        better = [h for h in search.hopeful if key(h) < key(best)
                  and h.eta is not None and h.eta <= ask.max_wait]  # fmt: skip
        if better:
            soonest = min(better, key=lambda h: (h.eta or 0.0, key(h)))
            return Wait(WaitReason.BETTER_SOON, soonest.blockers,
                        needed=soonest.place.bytes_on(soonest.place.device),
                        available=search.room.most.get(soonest.place.device, 0),
                        bound=soonest.eta or 0.0, rejected=tuple(search.rejected))  # fmt: skip
        others = [
            Rejected(o.place.artifact, o.place.rung, f"{o.place.type_k}/{o.place.type_v}",
                     RejectReason.NOT_CHOSEN, f"the {ask.goal.value} goal ranked "
                     f"{best.place.rung.value} of {best.place.artifact} first")
            for o in search.options if o is not best
        ]  # fmt: skip
        return replace(best.place, rejected=tuple(search.rejected + others))
    if search.hopeful:
        first = min(search.hopeful, key=key)
        blockers = sorted({b for h in search.hopeful for b in h.blockers})
        return Wait(WaitReason.BUSY_RESIDENTS, tuple(blockers),
                    needed=first.place.bytes_on(first.place.device),
                    available=search.room.most.get(first.place.device, 0),
                    bound=ask.max_wait, rejected=tuple(search.rejected))  # fmt: skip
    return _refuse(search)


def _refuse(search: Search) -> Refuse:
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
            return Refuse(refuse_as, r.needed, r.available, holders=r.holders, device=r.device,
                          detail=_first_detail(rejected, reason), rejected=rejected,
                          footprint=r.footprint, window=r.window)  # fmt: skip
    context = [r for r in rejected if r.reason in (RejectReason.BEYOND_TRAINING,
                                                   RejectReason.REFUSED_WINDOW)]  # fmt: skip
    if context:
        return Refuse(RefuseReason.CONTEXT, search.ask.need, 0, detail=context[0].detail,
                      rejected=rejected)  # fmt: skip
    return Refuse(RefuseReason.NO_CANDIDATE, 0, 0, detail="no rung applies to this model on "
                  "this box", rejected=rejected)  # fmt: skip


def _first_detail(rejected: tuple[Rejected, ...], reason: RejectReason) -> str:
    return next((r.detail for r in rejected if r.reason is reason), "")
