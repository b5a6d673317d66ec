"""What the dashboard shows, gathered by server/views/dashboard.py and rendered by
dashboard_html.py and dashboard_parts.py."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class DeviceView:
    id: str
    kind: str
    capacity: int
    simulated: bool
    holders: Sequence[tuple[str, str, int]]  # (model, state, bytes)


@dataclass(frozen=True)
class View:
    counter: int
    devices: Sequence[DeviceView]
    residents: Sequence[dict[str, Any]]
    queue: Sequence[dict[str, Any]]
    calls: Sequence[dict[str, Any]]
    evictions: Sequence[dict[str, Any]]
    refusals: Sequence[dict[str, Any]]
    now: float = field(default_factory=time.time)
    problems: Sequence[str] = ()  # what /health says to fix (the store's, store/db.py)
    admin: bool = False  # the caller may act: the buttons are shown (a read key only looks)
    catalog: Sequence[dict[str, Any]] = ()  # each model on disk and its plan (dashboard.py)
    logs: Mapping[str, tuple[str, Sequence[str]]] = field(default_factory=dict)  # admin only
    version: str = ""
    started_at: float | None = None  # the server's start (wall clock): its uptime
