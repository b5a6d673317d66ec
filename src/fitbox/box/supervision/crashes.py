"""Crash-loop bookkeeping: backoff between restarts, and a failed mark after too many crashes
in a window, kept until an operator clears it. Time is passed in, so it tests without
sleeping."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Failed:
    reason: str
    log_tail: list[str]
    at: float
    crashes: int


@dataclass
class CrashLedger:
    limit: int = 3  # crashes within ``window`` seconds that mark a model failed
    window: float = 300.0
    backoff: float = 1.0  # seconds after the first crash; doubles per crash in the window
    backoff_max: float = 30.0
    _times: dict[str, deque[float]] = field(default_factory=dict)
    _failed: dict[str, Failed] = field(default_factory=dict)

    def _recent(self, key: str, now: float) -> deque[float]:
        times = self._times.setdefault(key, deque())
        while times and now - times[0] > self.window:
            times.popleft()
        return times

    def crashed(self, key: str, reason: str, log_tail: list[str], now: float) -> Failed | None:
        """Record a crash (a failed load or an unexpected exit); the mark, if this made one."""
        times = self._recent(key, now)
        times.append(now)
        if len(times) >= self.limit:
            self._failed[key] = Failed(reason, log_tail, now, len(times))
            return self._failed[key]
        return None

    def failed(self, key: str) -> Failed | None:
        return self._failed.get(key)

    def wait_before_restart(self, key: str, now: float) -> float:
        times = self._recent(key, now)
        if not times:
            return 0.0
        delay: float = min(self.backoff * float(2 ** (len(times) - 1)), self.backoff_max)
        return max(0.0, times[-1] + delay - now)

    def clear(self, key: str) -> bool:
        self._times.pop(key, None)
        return self._failed.pop(key, None) is not None
