"""Holding a resource by an event the test controls, never by a race with the machine.

A stopped engine (SIGSTOP) makes no progress however fast the machine is: a call placed on
it stays on it, silent, until the test sends SIGCONT. The gated fake (fakes/gated-llama-server)
holds a real engine's reply, answering /health all the while, until the test opens its gate.
``until`` waits for a state with a generous bound; it never asserts that something did not
happen within a short time. Its bound, and ``Background.result``'s, is ``SAFETY_S``: a net
that turns a hang into a failure on a machine other work keeps busy, never what a test
checks (a 30 s or 120 s bound was hit on a loaded 2-core box while nothing was wrong).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

import httpx

from .paths import FAKES
from .processes import FitboxProcess

T = TypeVar("T")
# a stopped engine must not look hung while the test holds it: the watchdog probes an
# engine only after this many seconds without a byte, far beyond any hold in these tests
HOLD_IDLE_TIMEOUT = {"FITBOX_ENGINE_IDLE_TIMEOUT": "600"}
GATED = FAKES / "gated-llama-server"
SAFETY_S = 600.0  # how long a wait may take before it is a hang: a net, not a measurement


def gated_engine(real: Path, gate: Path) -> dict[str, str]:
    """Settings that run every engine behind the gated fake; ``gate.touch()`` opens it."""
    return {
        "LLAMA_SERVER_BIN": str(GATED),
        "FAKE_REAL_LLAMA_SERVER": str(real),
        "FAKE_GATE": str(gate),
    }


def engine_logs(box: FitboxProcess) -> str:
    """What every engine child printed (fitbox keeps one log file per launch)."""
    return "".join(p.read_text(errors="replace") for p in sorted((box.home / "logs").glob("*.log")))


def until(check: Callable[[], T | None], what: str, within: float = SAFETY_S) -> T:
    """``check()`` once it is truthy; fails naming ``what`` if it is not within the bound
    (a safety net: the state is what is checked, never how soon it came)."""
    deadline = time.monotonic() + within
    while not (value := check()):
        assert time.monotonic() < deadline, f"never came (waited {within:g} s): {what}"
        time.sleep(0.05)
    return value


def resident(box: FitboxProcess, model: str) -> dict[str, Any]:
    answer = httpx.get(f"{box.url}/v1/residents", headers=box.headers, timeout=30)
    data: list[dict[str, Any]] = answer.json()["data"]
    (found,) = [r for r in data if r["model"] == model]
    return found


def calls_on(box: FitboxProcess, model: str) -> int:
    """How many calls the resident serving ``model`` holds (0 when none is resident)."""
    data = httpx.get(f"{box.url}/v1/residents", headers=box.headers, timeout=30).json()["data"]
    return sum(int(r["calls"]) for r in data if r["model"] == model)


@contextlib.contextmanager
def engine_stopped(box: FitboxProcess, model: str) -> Iterator[int]:
    """SIGSTOP the engine serving ``model`` (its pid from /v1/residents) for the block, then
    SIGCONT it. Yields the pid."""
    pid = int(resident(box, model)["pid"])
    os.kill(pid, signal.SIGSTOP)
    try:
        yield pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


class Background(threading.Thread, Generic[T]):
    """``work()`` on a thread of its own; ``result()`` joins it and returns or re-raises."""

    def __init__(self, work: Callable[[], T]) -> None:
        super().__init__(daemon=True)
        self._work = work
        self._value: T | None = None
        self._error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self._value = self._work()
        except BaseException as exc:
            self._error = exc

    def result(self, within: float = SAFETY_S) -> T:
        self.join(within)
        assert not self.is_alive(), f"still running after {within:g} s (a hang, not slowness)"
        if self._error is not None:
            raise self._error
        return cast(T, self._value)
