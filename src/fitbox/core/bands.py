"""Context bands (FORMULAS.md §Context bands): the windows a call may load at, and the
largest one a placement holds."""

from __future__ import annotations

from collections.abc import Callable

from fitbox.core.ask import Ask, Candidate
from fitbox.core.decision import Band, BandKind, RejectReason

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


def band_windows(ask: Ask, candidate: Candidate) -> list[int] | tuple[RejectReason, str]:
    """Every window the call may load at, smallest first, before any placement's refused
    cap; or why none (the call needs more than the model was trained on)."""
    shape = candidate.shape
    needed = ask.slots.window_for(ask.need)
    trained = shape.n_ctx_train if shape and shape.n_ctx_train > 0 else None
    if trained is not None and needed > trained:
        return (
            RejectReason.BEYOND_TRAINING,
            f"the call needs {needed} tokens of window; trained on {trained}",
        )
    low = smallest_tick_at_least(needed)
    high = max(ask.window, low)
    if trained is not None:
        low, high = min(low, trained), min(high, trained)
    return window_ticks(low, high)


def reach(windows: list[int], candidate: Candidate, where: str) -> int | tuple[RejectReason, str]:
    """The index of the largest window a placement class may still be offered: below the
    lowest window that ran out of memory there with no success at or above it."""
    cap = candidate.window_cap(where)
    if cap is None:
        return len(windows) - 1
    low = windows[0]
    if low >= cap:
        return (
            RejectReason.REFUSED_WINDOW,
            f"a load at {cap} tokens failed on {where}; the call needs {low}",
        )
    ceiling = max((t for t in window_ticks(low, cap) if t < cap), default=low)
    return max(i for i, w in enumerate(windows) if w <= ceiling)


def largest(top: int, fits: Callable[[int], bool], low: int = 0) -> int | None:
    """The largest index in [low, top] that fits, by bisection (need grows with the window);
    None when ``low`` does not."""
    best = None
    while low <= top:
        mid = (low + top) // 2
        if fits(mid):
            best, low = mid, mid + 1
        else:
            top = mid - 1
    return best


def band(windows: list[int], index: int) -> Band:
    kind = BandKind.POINT if index == 0 else BandKind.RANGE
    return Band(kind, windows[0], windows[index])
