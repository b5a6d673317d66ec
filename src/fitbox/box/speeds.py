"""Measured speeds: what engines' own timings said about each file on each rung.

The last ``SPEED_WINDOW`` per (file, rung) are kept in memory (read from the store's
``recent_speeds`` view at start); the core reads their medians (FORMULAS.md §Goals). Each
decode rate is also kept by the cores the engine ran on when it was measured: the bandwidth
curve a claim reads (FORMULAS.md §CPU claims). Its last ``CURVE_WINDOW`` points per (file,
rung) are read from the store's ``recent_curve`` view at start (migrations/0017), so a
restarted box places with the curve it measured.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Iterable

from fitbox.core.ask import Speeds
from fitbox.engines.seam import CallTimings
from fitbox.models.catalog import Artifact
from fitbox.models.identity import Identity
from fitbox.store.db import MeasuredSpeed, Store

from .resident import Resident

SPEED_WINDOW = 20  # measured speeds kept per (file, rung)
CURVE_WINDOW = 60  # decode rates kept per (file, rung) for the curve, all core counts together
MIN_TOKENS = 4  # fewer tokens than this in a call's timings measure overhead, not speed


def median_speeds(
    recent: Iterable[MeasuredSpeed], by_cores: Iterable[tuple[int, float]] = ()
) -> Speeds:
    """The medians of the last measured prompt and decode ms per token, and per core count
    the median decode tokens/s (the bandwidth curve)."""
    rows = list(recent)
    prompt = [r.prompt_per_token_ms for r in rows if r.prompt_per_token_ms is not None]
    decode = [r.decode_per_token_ms for r in rows if r.decode_per_token_ms is not None]
    rates: dict[int, list[float]] = {}
    for cores, ms in by_cores:
        rates.setdefault(cores, []).append(1000.0 / ms)
    curve = tuple(sorted((n, statistics.median(r)) for n, r in rates.items()))
    return Speeds(prompt_ms=statistics.median(prompt) if prompt else None,
                  decode_ms=statistics.median(decode) if decode else None,
                  threads=curve)  # fmt: skip


class SpeedBook:
    def __init__(self, store: Store | None) -> None:
        self.store = store
        self._recent: dict[tuple[str, int, int, str], deque[MeasuredSpeed]] = {}
        # (cores it ran on, decode ms per token): the thread curve, as the store kept it
        self._curves: dict[tuple[str, int, int, str], deque[tuple[int, float]]] = {}
        for speed in store.recent_speeds() if store else []:
            self._recent.setdefault(speed.key, deque(maxlen=SPEED_WINDOW)).append(speed)
        for key, cores, decode_ms in store.recent_curve() if store else []:
            self._curves.setdefault(key, deque(maxlen=CURVE_WINDOW)).append((cores, decode_ms))

    def record(self, resident: Resident, timings: CallTimings, call_id: int) -> None:
        """A call's timings as a measured speed of this file on this rung, when they
        measured enough tokens to mean something."""
        prompt_ms = timings.prompt_per_token_ms if timings.prompt_n >= MIN_TOKENS else None
        decode_ms = timings.decode_per_token_ms if timings.decode_n >= MIN_TOKENS else None
        if prompt_ms is None and decode_ms is None:
            return
        try:
            identity = resident.artifact.identity()
        except OSError:
            return
        cores = len(resident.cores) or None  # none claimed: no point on the curve
        speed = MeasuredSpeed(
            *identity, resident.rung.value,
            resident.place.where if resident.place else resident.device, timings.prompt_n,
            prompt_ms, timings.decode_n, decode_ms, call_id, time.time(), cores,
        )  # fmt: skip
        self._recent.setdefault(speed.key, deque(maxlen=SPEED_WINDOW)).append(speed)
        if decode_ms and cores:
            self._curves.setdefault(speed.key, deque(maxlen=CURVE_WINDOW)).append(
                (cores, decode_ms)
            )
        if self.store is not None:
            self.store.speed_measured(speed)

    def of(self, artifact: Artifact, rung: str) -> Speeds:
        """Medians of the last measured speeds of a file on a rung (None where unmeasured)."""
        return self.by_rung(artifact).get(rung, Speeds())

    def by_rung(self, artifact: Artifact, identity: Identity | None = None) -> dict[str, Speeds]:
        """The medians for every rung the file was measured on (one stat of the file, or
        none when the caller has its identity)."""
        if identity is None:
            try:
                identity = artifact.identity()
            except OSError:
                return {}
        return {key[3]: median_speeds(recent, self._curves.get(key, ()))
                for key, recent in self._recent.items() if key[:3] == identity}  # fmt: skip
