"""Waiting for freed memory to show up, with a scripted probe."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from fitbox.box.supervision.memory import await_free


def readings(*values: int | None) -> Iterator[int | None]:
    yield from values
    while True:
        yield values[-1]


def test_waits_until_the_memory_is_back() -> None:
    probe = readings(1, 2, 5, 9)
    ok, _ = asyncio.run(await_free(lambda: next(probe), needed=8, poll_s=0.001))
    assert ok and next(probe) == 9  # stopped polling at the first reading that sufficed


def test_gives_up_at_the_bound_and_says_so() -> None:
    ok, waited = asyncio.run(await_free(lambda: 1, needed=8, limit_s=0.05, poll_s=0.01))
    assert not ok and waited >= 0.05


def test_an_unreadable_device_does_not_hold_the_load(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[None] = []
    naps: list[float] = []

    async def nap(seconds: float) -> None:
        naps.append(seconds)

    monkeypatch.setattr(asyncio, "sleep", nap)
    ok, _ = asyncio.run(await_free(lambda: reads.append(None), needed=8))
    assert ok and len(reads) == 1 and naps == []  # one look, no wait
