"""decide(): where a model goes, on which rung, at which window, and who leaves for it.

Pure: a complete ``Snapshot`` and an ``Ask`` in, a ``Place``, ``Wait`` or ``Refuse`` out,
with a named reason for every rung it did not take. FORMULAS.md §Decide walks the same
steps with their rules:

1. candidates: the approved variants in quality order (a pinned quant keeps one); a bad
   artifact is terminal;
2. per variant, rungs in ladder order; per rung the K/V types in the box's order, the
   window first: a later type only when it holds a larger window (``f16`` before ``q8_0``
   before a smaller window);
3. per rung and K/V type, the devices and the window band (``devicesets.py``: the largest
   window any set of GPUs holds, then the fewest GPUs; host; or, ``fitting.partial``, one
   GPU and host with a partial layer count);
4. the cheapest eviction that makes room now; the CPU claim;
5. the goal ranks what is admissible; waiting is chosen only when room for a better
   placement is expected within the call's max wait (``conclude.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from fitbox.core import bands, claims, evict, fourbit, norepack, sizing
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
from fitbox.core.devicesets import GpuSets, gpu_sets, place_on_sets
from fitbox.core.fitting import need, partial, placement_class, short, windows_for
from fitbox.core.room import Room
from fitbox.core.search import Fit, Option, Refusal, Search
from fitbox.core.split import HOST, Placement
from fitbox.core.types import WEIGHTS_IN_RAM, Goal, Rung, Snapshot

__all__ = ["Room", "Search", "decide", "rung_jobs", "try_kv", "window_ticks"]

GPU_RUNGS = frozenset({Rung.GPU_ONLY, Rung.FOUR_BIT, Rung.MOE_SPLIT})
NOT_OFFERED = {
    RejectReason.NOT_MOE: "not a mixture-of-experts model",
    RejectReason.NEEDS_LAYOUT: "partial offload needs the per-layer sizes of the file",
    RejectReason.NO_PARTIAL_OFFLOAD: "its engine loads a model whole on a GPU or in RAM, "
    "not part of its layers on each",
    RejectReason.NO_GPU_BACKEND: "its engine was built without a GPU backend: it loads "
    "everything in RAM",
}


def rung_jobs(ask: Ask, goal: Goal) -> Iterator[tuple[int, Candidate, Candidate, Rung]]:
    """(q, ladder owner, artifact loaded, rung) in the order they are tried."""
    candidates = [
        (q, c)
        for q, c in enumerate(ask.candidates)
        if ask.quant is None or c.quant.upper() == ask.quant.upper()
    ]

    def loaded(q: int, owner: Candidate, rung: Rung) -> Candidate | None:
        if rung is not Rung.FOUR_BIT:
            return owner
        if owner.four_bit:
            return None
        quantized = fourbit.in_place(owner)  # its engine quantizes it as it loads
        if quantized is not None:
            return quantized
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


def _because(reason: str) -> str:
    return f" ({reason})" if reason else ""


def _sets(
    search: Search, rung: Rung, candidate: Candidate
) -> tuple[GpuSets, GpuSets] | RejectReason | None:
    """The device sets a rung may use (``[[()]]``: host RAM); None: a partial offload,
    whose layer count ``fitting.partial`` searches."""
    room = search.room
    if _four_bit_in_ram(search, rung, candidate):
        return ([[()]], [[]])
    if rung is not Rung.RAM_ONLY and room.gpus and not (candidate.on_gpus or room.declared_gpus):
        # priced on a GPU, it would load in RAM: RAM the room never charged
        return RejectReason.NO_GPU_BACKEND
    if rung in GPU_RUNGS:
        if not room.gpus:
            return RejectReason.NO_GPU
        if rung is Rung.MOE_SPLIT and not candidate.is_moe:
            return RejectReason.NOT_MOE
        if search.gpu_sets is None:
            search.gpu_sets = gpu_sets(room)
        # a split needs the per-layer sizes; without them only one GPU is priced
        first, then = search.gpu_sets
        return (first, then) if candidate.layout is not None else (first[:1], then[:1])
    if rung is Rung.RAM_ONLY:
        return ([[()]], [[]]) if room.has_host else RejectReason.NO_GPU
    if not room.gpus:
        return RejectReason.NO_GPU
    if not candidate.partial_offload:
        return RejectReason.NO_PARTIAL_OFFLOAD
    if candidate.layout is None:
        return RejectReason.NEEDS_LAYOUT
    return None


def _four_bit_in_ram(search: Search, rung: Rung, candidate: Candidate) -> bool:
    """A folder its engine quantizes as it loads (bitsandbytes runs on the CPU too), asked
    for on the 4bit rung alone (``@4bit``) where no GPU can take it: loaded in host RAM.
    Never offered beside other rungs: a box without a GPU keeps loading folders whole."""
    room = search.room
    no_gpu = not room.gpus or not (candidate.on_gpus or room.declared_gpus)
    return (
        rung is Rung.FOUR_BIT
        and candidate.load_in_4bit
        and search.ask.rungs == (Rung.FOUR_BIT,)
        and no_gpu
        and room.has_host
    )


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


@dataclass
class Attempt:
    """One K/V type of one rung that fits; admitted only if the rung's rule picks it."""

    fit: Fit
    type_k: str
    type_v: str
    position: int  # when it was tried: the ladder order


def _fit_kv(
    search: Search, q: int, candidate: Candidate, rung: Rung, type_k: str, type_v: str
) -> Attempt | None:
    """The rule's placement for one rung at one K/V type; or None, with the reason recorded
    (and a hopeful option when busy residents hold the room)."""
    ask, room = search.ask, search.room
    kv = f"{type_k}/{type_v}"
    search.position += 1

    def reject(reason: RejectReason, detail: str) -> None:
        search.rejected.append(Rejected(candidate.key, rung, kv, reason, detail))

    if candidate.shape is not None:
        problem = sizing.kv_type_problem(candidate.shape, type_k, type_v, flash_attn=True)
        if problem:
            reject(RejectReason.KV_TYPE, problem)
            return None
    sizer = Sizer(candidate, ask.slots.count, type_k, type_v, ask.slots.unified)
    sets = _sets(search, rung, candidate)
    if isinstance(sets, RejectReason):
        no_gpu = "this box has no GPU" if rung is not Rung.RAM_ONLY else "host RAM is not offered"
        reject(sets, NOT_OFFERED.get(sets, no_gpu))
        return None
    fit: Fit | Rejected | None
    first_short: Placement | None
    if sets is None:
        fit = partial(search, sizer, rung)
        first_short = Placement((room.roomiest_gpu(),), 1, (), False)
    else:
        multi = rung in GPU_RUNGS and len(sets[0]) > 1
        fit, first_short = place_on_sets(
            search, sizer, sets, experts=rung is Rung.MOE_SPLIT, counts=multi
        )
    if isinstance(fit, Rejected):
        reject(fit.reason, fit.detail)
        return None
    if fit is None:
        assert first_short is not None
        why = short(search, sizer, first_short)
        reject(why.reason, why.detail)
        if why.reason is RejectReason.HELD_BY_BUSY:
            _hope(search, q, candidate, rung, sizer, first_short, memory=True)
        return None
    return Attempt(fit, type_k, type_v, search.position)


def try_kv(
    search: Search, q: int, candidate: Candidate, rung: Rung, type_k: str, type_v: str
) -> None:
    """One rung at one K/V type, admitted if it fits (verdicts price each type alone)."""
    attempt = _fit_kv(search, q, candidate, rung, type_k, type_v)
    if attempt is not None:
        _admit(search, q, candidate, rung, attempt)


def _try_rung(search: Search, q: int, candidate: Candidate, rung: Rung) -> None:
    """The K/V types in the box's order, the window first: a later type is taken only when
    it holds a larger window than every earlier one."""
    windows = bands.band_windows(search.ask, candidate)
    ceiling = windows[-1] if isinstance(windows, list) else 0
    fits: list[Attempt] = []
    for type_k, type_v in search.ask.kv_types:
        attempt = _fit_kv(search, q, candidate, rung, type_k, type_v)
        if attempt is not None:
            fits.append(attempt)
            if attempt.fit.window >= ceiling:
                break  # the preferred window: no later type can hold more
    if not fits:
        return
    best = max(fits, key=lambda a: a.fit.window)  # the first of the largest: the box's order
    for other in fits:
        if other is not best:
            search.rejected.append(
                Rejected(
                    candidate.key,
                    rung,
                    f"{other.type_k}/{other.type_v}",
                    RejectReason.SMALLER_WINDOW,
                    f"holds {other.fit.window} tokens; {best.type_k}/{best.type_v} holds "
                    f"{best.fit.window}",
                )
            )
    _admit(search, q, candidate, rung, best)


def _hope(
    search: Search,
    q: int,
    candidate: Candidate,
    rung: Rung,
    sizer: Sizer,
    placement: Placement,
    *,
    memory: bool,
) -> None:
    """A placement possible once busy residents settle: a Wait option."""
    room = search.room
    windows = windows_for(search, sizer, placement_class(placement, sizer.n_layer))
    window = windows[0] if isinstance(windows, list) else 1
    wanted = need(sizer, placement, window)
    lacking = {d for d, f in wanted.items() if f.total > room.most.get(d, -1)}
    blockers = tuple(
        sorted(
            r.key
            for r in search.snapshot.residents
            if r.settles and (any(r.bytes_on(d) for d in lacking) if memory else r.cores)
        )
    )
    etas = [r.eta_idle for r in search.snapshot.residents if r.key in blockers]
    eta = max((e for e in etas if e is not None), default=None) if None not in etas else None
    fit = Fit(placement, window, wanted, Band(BandKind.POINT, window, window))
    place = _place(candidate, rung, sizer.type_k, sizer.type_v, fit, (), claims.Claim(()), search)
    search.hopeful.append(
        Option(
            place, q, search.position, _seconds(search.ask, candidate, rung), 0.0, 0, blockers, eta
        )
    )


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
        artifact=candidate.key,
        rung=rung,
        window=fit.window,
        type_k=type_k,
        type_v=type_v,
        devices=devices,
        footprint=tuple(sorted(fit.need.items())),
        gpu_layers=fit.placement.gpu_layers,
        tensor_split=fit.placement.tensor_split,
        experts_in_ram=fit.placement.experts_in_ram,
        victims=victims,
        cores=claim.cores,
        cores_from=claim.taken_from,
        band=fit.band,
        predicted_seconds=_seconds(search.ask, candidate, rung),
        where=placement_class(fit.placement, candidate.shape.n_layer if candidate.shape else 0)
        + norepack.placement_suffix(candidate)  # repack hook 2/2: facts of --no-repack apart
        + fourbit.placement_suffix(candidate),  # and those of a load quantized to 4-bit
        repack=norepack.repack_reason(candidate, fit.placement),
        slots=search.ask.slots.count,
        kv_unified=search.ask.slots.unified,
        load_in_4bit=candidate.load_in_4bit,
    )


def _admit(search: Search, q: int, candidate: Candidate, rung: Rung, attempt: Attempt) -> None:
    snapshot, room, fit = search.snapshot, search.room, attempt.fit
    lacking = {d: f.total - room.now[d] for d, f in fit.need.items()}
    chosen = evict.choose(lacking, [r for r in snapshot.residents if r.evictable])
    assert chosen is not None, "fits room.most, so the idle residents cover it"
    leaving = {v.key for v in chosen}
    speeds = candidate.speeds_on(rung)
    in_ram = rung in WEIGHTS_IN_RAM or _four_bit_in_ram(search, rung, candidate)
    claim = claims.claim(
        snapshot.cores,
        snapshot.busy_cores,
        snapshot.residents,
        leaving,
        weights_in_ram=in_ram,
        floor=search.ask.cpu_floor,
        threads=speeds.threads if speeds else (),
        lend=snapshot.lend_reserved,
    )
    type_k, type_v = attempt.type_k, attempt.type_v
    if claim is None:
        free, idle_cores = claims.claimable(
            snapshot.cores, snapshot.busy_cores, snapshot.residents, leaving
        )
        floor = search.ask.cpu_floor if in_ram else 1
        detail = f"{len(free) + len(idle_cores)} free physical core(s); needs {floor}"
        search.rejected.append(
            Rejected(candidate.key, rung, f"{type_k}/{type_v}", RejectReason.NO_CORES, detail)
        )
        if any(r.settles and r.cores for r in snapshot.residents):
            slots = search.ask.slots
            sizer = Sizer(candidate, slots.count, type_k, type_v, slots.unified)
            _hope(search, q, candidate, rung, sizer, fit.placement, memory=False)
        else:
            search.refusals.append(
                Refusal(
                    RejectReason.NO_CORES, HOST, search.ask.cpu_floor, len(free) + len(idle_cores)
                )
            )
        return
    by_key = {r.key: r for r in snapshot.residents}
    place = _place(candidate, rung, type_k, type_v, fit, tuple(chosen), claim, search)
    search.options.append(
        Option(
            place,
            q,
            attempt.position,
            place.predicted_seconds,
            reload=sum(v.cost for v in chosen),
            hot=sum(1 for v in chosen if by_key[v.key].band > 1),
            counts=fit.counts,
        )
    )


def decide(snapshot: Snapshot, ask: Ask) -> Decision:
    search = Search(snapshot, ask, Room(snapshot))
    tried = 0
    for q, owner, artifact, rung in rung_jobs(ask, ask.goal):
        if artifact.terminal:
            return Refuse(
                RefuseReason.BAD_ARTIFACT,
                0,
                0,
                detail=artifact.terminal,
                rejected=tuple(search.rejected),
            )
        if rung is Rung.FOUR_BIT and artifact is owner:
            search.rejected.append(
                Rejected(
                    owner.key,
                    rung,
                    "",
                    RejectReason.NO_FOUR_BIT_VARIANT,
                    "already 4-bit"
                    if owner.four_bit
                    else "no approved Q4-class variant, and its engine cannot "
                    f"quantize it to 4-bit as it loads{_because(owner.no_four_bit)}",
                )
            )
            continue
        if (
            ask.goal is not Goal.FAST
            and search.options
            and all(o.seconds is not None for o in search.options)
            and q > min(o.q for o in search.options)
        ):
            break  # q ranks first: a lower-quality variant can no longer win
        before = len(search.options)
        tried += len(ask.kv_types)
        _try_rung(search, q, artifact, rung)
        # repack hook 1/2 (core/repack.py): RAM kept the repacked copy out: --no-repack
        plain = norepack.without(artifact, rung, search.rejected, len(search.options) > before)
        if plain is not None:
            _try_rung(search, q, plain, rung)
        if search.options and search.options[-1].seconds is None:
            break  # ladder order decides from here: the first admissible option wins
    if tried == 0:
        return Refuse(
            RefuseReason.NO_CANDIDATE,
            0,
            0,
            detail="no approved variant or rung is left by the pins and settings"
            + "".join(f"; {r.rung.value}: {r.detail}" for r in search.rejected),
            rejected=tuple(search.rejected),
        )
    return conclude(search)
