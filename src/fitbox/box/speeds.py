"""Measured speeds: what engines' own timings said about each file on each rung.

The last ``SPEED_WINDOW`` per (file, rung) are kept in memory (read from the store's
``recent_speeds`` view at start); the core reads their medians (FORMULAS.md §Goals).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from fitbox.core.ask import Speeds
from fitbox.models.catalog import Artifact
from fitbox.store.db import MeasuredSpeed, Store

from .planning import median_speeds
from .resident import Resident

SPEED_WINDOW = 20  # measured speeds kept per (file, rung)
MIN_TOKENS = 4  # fewer tokens than this in a call's timings measure overhead, not speed


class SpeedBook:
    def __init__(self, store: Store | None) -> None:
        self.store = store
        self._recent: dict[tuple[str, int, int, str], deque[MeasuredSpeed]] = {}
        for speed in store.recent_speeds() if store else []:
            self._recent.setdefault(speed.key, deque(maxlen=SPEED_WINDOW)).append(speed)

    def record(self, resident: Resident, timings: dict[str, Any], call_id: int) -> None:
        """An engine's timings as a measured speed of this file on this rung, when they
        measured enough tokens to mean something."""
        prompt_n, decode_n = timings.get("prompt_n") or 0, timings.get("predicted_n") or 0
        prompt_ms = timings.get("prompt_per_token_ms") if prompt_n >= MIN_TOKENS else None
        decode_ms = timings.get("predicted_per_token_ms") if decode_n >= MIN_TOKENS else None
        if prompt_ms is None and decode_ms is None:
            return
        try:
            stat = resident.artifact.path.stat()
        except OSError:
            return
        speed = MeasuredSpeed(
            str(resident.artifact.path), stat.st_size, stat.st_mtime_ns, resident.rung.value,
            resident.place.where if resident.place else resident.device, prompt_n, prompt_ms,
            decode_n, decode_ms, call_id, time.time(),
        )  # fmt: skip
        self._recent.setdefault(speed.key, deque(maxlen=SPEED_WINDOW)).append(speed)
        if self.store is not None:
            self.store.speed_measured(speed)

    def of(self, artifact: Artifact, rung: str) -> Speeds:
        """Medians of the last measured speeds of a file on a rung (None where unmeasured)."""
        return self.by_rung(artifact).get(rung, Speeds())

    def by_rung(self, artifact: Artifact) -> dict[str, Speeds]:
        """The medians for every rung the file was measured on (one stat of the file)."""
        try:
            stat = artifact.path.stat()
        except OSError:
            return {}
        identity = (str(artifact.path), stat.st_size, stat.st_mtime_ns)
        return {key[3]: median_speeds(recent) for key, recent in self._recent.items()
                if key[:3] == identity}  # fmt: skip
