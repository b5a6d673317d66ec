"""No ``asyncio.wait_for`` in fitbox: on Python 3.11 (what the .deb targets) a wait_for
whose awaited call is done when a cancel lands returns the result and loses the cancel, so
a loop that used one ran on after a stop cancelled it (box/growth.py, the sensor loop: the
stop then hung until systemd's kill). ``asyncio.timeout`` keeps the cancel."""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "fitbox"


def test_no_module_bounds_an_await_with_wait_for() -> None:
    found = [
        f"{path.relative_to(SRC)}:{n}"
        for path in sorted(SRC.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\bwait_for\(", line) and not line.lstrip().startswith("#")
    ]
    assert found == [], f"use asyncio.timeout instead of wait_for at {found}"
