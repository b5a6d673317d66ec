"""A resident: one loaded (or loading, or leaving) engine child and what it holds."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from fitbox.core.types import Footprint, ResidentState, ResidentView
from fitbox.engines.child import Child
from fitbox.models.catalog import Artifact


def _quiet_future() -> asyncio.Future[None]:
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    # a load that fails with nobody waiting must not warn "exception never retrieved"
    future.add_done_callback(lambda f: f.cancelled() or f.exception())
    return future


@dataclass(eq=False)
class Resident:
    artifact: Artifact
    device: str
    footprint: Footprint
    window: int
    parallel: int
    simulated: bool
    state: ResidentState = ResidentState.STARTING
    calls: int = 0
    last_used: float = field(default_factory=time.monotonic)
    child: Child | None = None
    load_started_at: float | None = None  # unix stamps, for the call log
    ready_at: float | None = None
    load_seconds: float | None = None
    ready: asyncio.Future[None] = field(default_factory=_quiet_future)
    basis: str = "estimate"  # or "measured": where ``footprint`` came from
    pinned: bool = False
    child_start_time: float = 0.0  # the process start time recorded with it (orphans.py)
    loaded_by_call: int | None = None

    @property
    def key(self) -> str:
        return self.artifact.key

    def view(self) -> ResidentView:
        return ResidentView(
            key=self.key,
            device=self.device,
            bytes=self.footprint.total,
            state=self.state,
            calls=self.calls,
            last_used=self.last_used,
            pinned=self.pinned,
        )

    def describe(self) -> dict[str, Any]:
        return {
            "model": self.artifact.name,
            "artifact": str(self.artifact.path),
            "state": self.state.value,
            "device": self.device,
            "simulated": self.simulated,
            "bytes": self.footprint.total,
            "basis": self.basis,
            "footprint": {
                "weights": self.footprint.weights,
                "kv": self.footprint.kv,
                "compute": self.footprint.compute,
                "output": self.footprint.output,
            },
            "window": self.window,
            "parallel": self.parallel,
            "calls": self.calls,
            "pinned": self.pinned,
            "idle_for_s": round(time.monotonic() - self.last_used, 3) if not self.calls else 0,
            "pid": self.child.pid if self.child else None,
            "port": self.child.port if self.child else None,
            "load_seconds": self.load_seconds,
        }
