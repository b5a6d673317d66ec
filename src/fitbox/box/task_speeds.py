"""Measured task speeds: units of work a task model does per second (audio seconds it
transcribes, characters it speaks, images it makes), the last ``TASK_WINDOW`` per file.

A task call names its work when it opens (``Order.work``: server/inference/tasks.py); once
it ended whole, its units over the engine's seconds (admitted → its last byte) are kept
here, and a later call's ETA is its work over their median (core/admission.py
``task_seconds``): /v1/queue shows it, and the queue orders by it as it does chat's. Kept
in memory: a restarted box measures again from its first call.
"""

from __future__ import annotations

from collections import deque

from fitbox.core.admission import task_seconds
from fitbox.models.catalog import Artifact
from fitbox.models.identity import Identity

TASK_WINDOW = 20  # rates kept per file


class TaskRates:
    def __init__(self) -> None:
        self._rates: dict[Identity, deque[float]] = {}

    def record(self, artifact: Artifact, units: float, seconds: float) -> None:
        """A finished call's work over the seconds its engine took for it."""
        if units <= 0 or seconds <= 0:
            return
        try:
            key = artifact.identity()
        except OSError:
            return
        self._rates.setdefault(key, deque(maxlen=TASK_WINDOW)).append(units / seconds)

    def rates(self, artifact: Artifact) -> list[float]:
        try:
            return list(self._rates.get(artifact.identity(), ()))
        except OSError:
            return []

    def seconds(self, artifact: Artifact, work: float | None) -> float | None:
        """Seconds a call with ``work`` units is expected to take on this file; None when
        its work or the file's speed is unknown."""
        return task_seconds(work, self.rates(artifact))


# what a task's work is counted in (server/inference/tasks.py ``Task.work``)
WORK_UNITS = {"transcription": "audio seconds", "speech": "characters", "image": "images"}


def work_units(task: str) -> str:
    return WORK_UNITS.get(task, "units")
