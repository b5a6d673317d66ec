"""server/views/dashboard.py's pacing in process: a change is rendered once the store's counter
has stayed still (after the reply of the call that moved it), never while changes keep
coming until the spacing's bound. The signal is the test's own: each wait is answered by
the test, as a change or as a quiet wait, so nothing here depends on the machine's speed."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from fitbox.server.views import dashboard


class HeldSignal:
    """A change signal whose every wait the test answers: ``change()`` moves the counter
    and ends the wait, ``quiet()`` ends it with nothing new."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.limits: list[float] = []
        self.asked = asyncio.Event()  # a wait is open
        self.waiting: asyncio.Future[None] | None = None

    async def wait(self, limit_s: float, leaving: asyncio.Event | None = None) -> None:
        self.limits.append(limit_s)
        self.waiting = asyncio.get_running_loop().create_future()
        self.asked.set()
        await self.waiting

    async def _answer(self, moved: bool) -> None:
        await self.asked.wait()
        self.asked.clear()
        if moved:
            self.store.counter += 1
        assert self.waiting is not None
        self.waiting.set_result(None)

    async def change(self) -> None:
        await self._answer(moved=True)

    async def quiet(self) -> None:
        await self._answer(moved=False)


def test_a_render_waits_until_the_counter_is_still() -> None:
    async def run() -> None:
        store = SimpleNamespace(counter=7)
        signal = HeldSignal(store)
        settled = asyncio.ensure_future(dashboard._settled(signal, store, asyncio.Event()))  # type: ignore[arg-type]
        for _ in range(3):  # a call's row opens, it ends, the next call's opens
            await signal.change()
            await asyncio.sleep(0)
            assert not settled.done()
        await signal.quiet()
        await settled
        assert store.counter == 10 and len(signal.limits) == 4
        assert all(0 < limit <= dashboard.QUIET_S for limit in signal.limits)

    asyncio.run(run())


def test_changes_that_never_stop_are_rendered_at_the_spacing_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def run() -> None:
        store = SimpleNamespace(counter=0)
        signal = HeldSignal(store)
        await dashboard._settled(signal, store, asyncio.Event())  # type: ignore[arg-type]
        assert signal.limits == []  # the bound had passed: no wait at all
        leaving = asyncio.Event()
        leaving.set()
        monkeypatch.undo()
        await dashboard._settled(signal, store, leaving)  # type: ignore[arg-type]
        assert signal.limits == []  # a stopping server renders nothing more

    monkeypatch.setattr(dashboard, "SPACING_S", 0.0)
    asyncio.run(run())
