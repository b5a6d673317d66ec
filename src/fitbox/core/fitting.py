"""One placement priced against the room: its need per device, why it is short, and the
partial-offload layer count (FORMULAS.md §Rungs)."""

from __future__ import annotations

from fitbox.core import bands
from fitbox.core.costs import Sizer
from fitbox.core.decision import Rejected, RejectReason
from fitbox.core.search import Fit, Refusal, Search
from fitbox.core.split import HOST, Placement
from fitbox.core.types import Footprint, Rung

NOTHING = Footprint(0, 0, 0, 0)


def placement_class(placement: Placement, n_layer: int) -> str:
    """What measured facts (footprints, refused windows) are filed under: the device of a
    whole-model placement, else its devices joined with ``+`` (``gpu0+host``)."""
    if not placement.gpus or placement.gpu_layers <= 0:
        return HOST
    where = "+".join(placement.gpus)
    if placement.gpu_layers < n_layer + 1 or placement.experts_in_ram:
        where += f"+{HOST}"
    return where


def need(sizer: Sizer, placement: Placement, window: int) -> dict[str, Footprint]:
    found = sizer.on(placement, window)
    where = placement_class(placement, sizer.n_layer)
    measured = sizer.candidate.measured_fit(where, window, sizer.type_k, sizer.type_v)
    if measured is not None:
        found[where] = measured
    return found


def windows_for(search: Search, sizer: Sizer, where: str) -> list[int] | tuple[RejectReason, str]:
    """The windows one placement class may load at, smallest first."""
    windows = bands.band_windows(search.ask, sizer.candidate)
    if isinstance(windows, tuple):
        return windows
    top = bands.reach(windows, sizer.candidate, where)
    return top if isinstance(top, tuple) else windows[: top + 1]


def short(search: Search, sizer: Sizer, placement: Placement) -> Rejected:
    """Why a placement cannot fit at its smallest window, recorded with its numbers."""
    room, candidate = search.room, sizer.candidate
    windows = windows_for(search, sizer, placement_class(placement, sizer.n_layer))
    window = windows[0] if isinstance(windows, list) else 1
    wanted = need(sizer, placement, window)
    kv = f"{sizer.type_k}/{sizer.type_v}"
    larger = _larger_than_box(search, sizer, wanted, window)
    if larger is not None:
        return larger
    lacking = [d for d, f in wanted.items() if f.total > room.most[d]]
    if not lacking:  # partial offload: each side fits alone, no layer count fits both
        return Rejected(
            candidate.key,
            Rung.GPU_ONLY,
            kv,
            RejectReason.WINDOW_INFEASIBLE,
            "no layer count fits both the GPU and the host",
        )
    device = lacking[0]
    if room.fits(wanted, room.hopeful):
        return Rejected(
            candidate.key,
            Rung.GPU_ONLY,
            kv,
            RejectReason.HELD_BY_BUSY,
            f"needs {wanted[device].total} B on {device}; {room.most[device]} B "
            "free once idle models leave; busy models hold the rest",
        )
    holders = tuple(
        sorted(
            r.key
            for r in search.snapshot.residents
            if r.pinned and any(r.bytes_on(d) for d in lacking)
        )
    )
    search.refusals.append(
        Refusal(
            RejectReason.HELD_BY_PINNED,
            device,
            wanted[device].total,
            room.most[device],
            holders,
            wanted[device],
            window,
        )
    )
    detail = f"needs {wanted[device].total} B on {device}; pinned models hold the room"
    return Rejected(candidate.key, Rung.GPU_ONLY, kv, RejectReason.HELD_BY_PINNED, detail)


def _larger_than_box(
    search: Search, sizer: Sizer, wanted: dict[str, Footprint], window: int
) -> Rejected | None:
    """The refusal for a placement that needs more on a device than it holds empty, if one
    does: no eviction could ever make room for it."""
    room = search.room
    for device, footprint in wanted.items():
        if footprint.total > room.empty.get(device, -1):
            empty = room.empty.get(device, 0)
            search.refusals.append(
                Refusal(
                    RejectReason.LARGER_THAN_BOX,
                    device,
                    footprint.total,
                    empty,
                    (),
                    footprint,
                    window,
                )
            )
            return Rejected(
                sizer.candidate.key,
                Rung.GPU_ONLY,
                f"{sizer.type_k}/{sizer.type_v}",
                RejectReason.LARGER_THAN_BOX,
                f"needs {footprint.total} B on {device} at {window} tokens; an "
                f"empty {device} holds {room.empty.get(device, 0)} B",
            )
    return None


def partial(search: Search, sizer: Sizer, rung: Rung) -> Fit | Rejected | None:
    """max-gpu: the most layers one GPU holds; max-ram: the fewest it must (host holds the
    rest). Host need falls and GPU need grows with the layer count, so both bisect."""
    room = search.room
    gpu = room.roomiest_gpu()
    n_layer = sizer.n_layer
    windows = windows_for(search, sizer, placement_class(Placement((gpu,), 1), n_layer))
    if isinstance(windows, tuple):
        return Rejected(sizer.candidate.key, rung, "", *windows)

    def at(layers: int) -> Placement:
        return Placement((gpu,), layers, (), False)

    def on(device: str, layers: int, window: int) -> int:
        return need(sizer, at(layers), windows[window]).get(device, NOTHING).total

    def layers_for(window: int) -> int | None:
        # the most layers the GPU holds, and the fewest the host can spare
        most_gpu = bands.largest(n_layer - 1, lambda i: on(gpu, i + 1, window) <= room.most[gpu])
        spare = bands.largest(
            n_layer - 1, lambda i: on(HOST, n_layer - i, window) <= room.most.get(HOST, -1)
        )
        if most_gpu is None or spare is None or n_layer - spare > most_gpu + 1:
            return None
        return most_gpu + 1 if rung is Rung.MAX_GPU else n_layer - spare

    best = bands.largest(len(windows) - 1, lambda i: layers_for(i) is not None)
    if best is None:
        return None
    layers = layers_for(best)
    assert layers is not None
    placement = at(layers)
    return Fit(
        placement, windows[best], need(sizer, placement, windows[best]), bands.band(windows, best)
    )
