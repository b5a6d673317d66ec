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
from .task_speeds import TaskRates

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
    return Speeds(
        prompt_ms=statistics.median(prompt) if prompt else None,
        decode_ms=statistics.median(decode) if decode else None,
        threads=curve,
    )


SpeedKey = tuple[str, int, int, str]  # (artifact, size, mtime_ns, rung)


def preferred(own: Speeds, imported: Speeds) -> Speeds:
    """This box's own medians, each figure it has not measured yet taken from another box's
    measurement of the same bytes: its own is preferred once it has one."""
    return Speeds(
        load_seconds=own.load_seconds if own.load_seconds is not None else imported.load_seconds,
        prompt_ms=own.prompt_ms if own.prompt_ms is not None else imported.prompt_ms,
        decode_ms=own.decode_ms if own.decode_ms is not None else imported.decode_ms,
        threads=own.threads or imported.threads,
    )


class SpeedBook:
    def __init__(self, store: Store | None) -> None:
        self.store = store
        self._recent: dict[SpeedKey, deque[MeasuredSpeed]] = {}
        # (cores it ran on, decode ms per token): the thread curve, as the store kept it
        self._curves: dict[SpeedKey, deque[tuple[int, float]]] = {}
        # the same, measured by other boxes on files with the same bytes (imported)
        self._imported: dict[SpeedKey, deque[MeasuredSpeed]] = {}
        self._imported_curves: dict[SpeedKey, deque[tuple[int, float]]] = {}
        self.tasks = TaskRates()  # task models' units per second (box/task_speeds.py)
        for speed in store.recent_speeds() if store else []:
            self._keep(speed)
        for key, cores, decode_ms, origin in store.recent_curve() if store else []:
            curves = self._curves if origin is None else self._imported_curves
            curves.setdefault(key, deque(maxlen=CURVE_WINDOW)).append((cores, decode_ms))

    def _keep(self, speed: MeasuredSpeed, curve: bool = False) -> None:
        own = speed.origin_box is None
        recent, curves = (
            (self._recent, self._curves) if own else (self._imported, self._imported_curves)
        )
        recent.setdefault(speed.key, deque(maxlen=SPEED_WINDOW)).append(speed)
        if curve and speed.decode_per_token_ms and speed.cores:
            curves.setdefault(speed.key, deque(maxlen=CURVE_WINDOW)).append(
                (speed.cores, speed.decode_per_token_ms)
            )

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
            *identity,
            resident.rung.value,
            resident.place.where if resident.place else resident.device,
            timings.prompt_n,
            prompt_ms,
            timings.decode_n,
            decode_ms,
            call_id,
            time.time(),
            cores,
        )
        self._keep(speed, curve=True)
        if self.store is not None:
            self.store.speed_measured(speed)

    def imported(self, speed: MeasuredSpeed) -> None:
        """File a speed another box measured on a file with these bytes (its key is this
        box's file): it prices ETAs and claims until this box measures its own."""
        self._keep(speed, curve=True)
        if self.store is not None:
            self.store.speed_imported(speed)

    def of(self, artifact: Artifact, rung: str) -> Speeds:
        """Medians of the last measured speeds of a file on a rung (None where unmeasured)."""
        return self.by_rung(artifact).get(rung, Speeds())

    def by_rung(self, artifact: Artifact, identity: Identity | None = None) -> dict[str, Speeds]:
        """The medians for every rung the file was measured on (one stat of the file, or
        none when the caller has its identity): this box's own, another box's where this
        one has not measured yet."""
        if identity is None:
            try:
                identity = artifact.identity()
            except OSError:
                return {}
        keys = {k for k in (*self._recent, *self._imported) if k[:3] == identity}
        return {
            key[3]: preferred(
                median_speeds(self._recent.get(key, ()), self._curves.get(key, ())),
                median_speeds(self._imported.get(key, ()), self._imported_curves.get(key, ())),
            )
            for key in keys
        }

    def origins(self, artifact: Artifact, rung: str) -> list[str]:
        """The boxes whose measurements of this file on this rung this box prices from, in
        place of its own (none: its own, or none measured)."""
        try:
            key = (*artifact.identity(), rung)
        except OSError:
            return []
        own = median_speeds(self._recent.get(key, ()), self._curves.get(key, ()))
        other = median_speeds(self._imported.get(key, ()), self._imported_curves.get(key, ()))
        borrowed = (
            (own.prompt_ms is None and other.prompt_ms is not None)
            or (own.decode_ms is None and other.decode_ms is not None)
            or (not own.threads and bool(other.threads))
        )
        if not borrowed:
            return []
        return sorted({s.origin_box for s in self._imported.get(key, ()) if s.origin_box})
