"""The room a placement sees keeps, for each live resident whose cache grows with its
tokens, its budget less what it holds now (issue #16): box/growth.py asks the engine,
Resident.in_use says what a free-memory reading already shows, box/snapshot.py adds that
back and core/room.py charges the budget. The engine here is a recording fake (pure
bookkeeping: a real child's /props is read by tests/test_tf_e2e.py); the host reading is
pinned so two snapshots differ only by what the residents hold."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import pytest

from fitbox import config as settings
from fitbox.box import snapshot as snapshot_module
from fitbox.box.growth import refresh_held_now
from fitbox.box.preferences import Preferences
from fitbox.box.resident import Resident
from fitbox.box.residents import Registry
from fitbox.box.snapshot import Snapshots
from fitbox.core.room import Room
from fitbox.core.types import Footprint, ResidentState
from fitbox.engines.seam import Engine
from fitbox.models.catalog import Artifact
from fitbox.probe.gpus import SimulatedGpus
from fitbox.probe.host import HostReading

GiB = 1 << 30
WEIGHTS, KV, COMPUTE = 2 * GiB, 3 * GiB, GiB // 2
HOST = HostReading(
    mem_total=64 * GiB, mem_available=20 * GiB, swap_free=0, physical_cores=4, logical_cores=4
)


class Growing:
    """An engine whose child holds ``now`` bytes, or never answers (``hang``)."""

    name = "growing"

    def __init__(self, now: int | None, hang: bool = False) -> None:
        self.now, self.hang, self.asked = now, hang, 0

    async def held_now(self, child: object) -> int | None:
        self.asked += 1
        if self.hang:
            await asyncio.Event().wait()  # a SIGSTOPped child: never set
        return self.now


def resident(tmp_path: Path, engine: Growing, name: str = "m") -> Resident:
    facts = cast(Any, object())
    artifact = Artifact(name=name, path=tmp_path / name, facts=facts)
    r = Resident(
        artifact=artifact,
        device="host",
        footprint=Footprint(WEIGHTS, KV, COMPUTE, 0),
        window=4096,
        parallel=1,
        simulated=False,
        engine=cast(Engine, engine),
    )
    r.basis = "measured"
    r.child = cast(Any, object())  # only handed to the engine, which ignores it
    return r


def host_room(registry: Registry, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> int:
    monkeypatch.setattr(snapshot_module, "read_host", lambda: HOST)
    config = settings.load({"home": str(tmp_path / "home")}, env={})
    snaps = Snapshots(SimulatedGpus("8GiB"), registry, Preferences(config))
    return Room(snaps.snapshot()).now["host"]


def test_a_growing_resident_keeps_its_budget_less_what_it_holds_now(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        registry = Registry()
        engine = Growing(WEIGHTS + COMPUTE + GiB)  # its cache grew to 1 GiB of its 3
        r = resident(tmp_path, engine)
        registry.add(r)
        registry.move(r, ResidentState.READY)
        budgeted = host_room(registry, monkeypatch, tmp_path)  # nothing asked yet: all of it
        assert budgeted == HOST.mem_available - WEIGHTS  # its weights are page cache
        await refresh_held_now(registry)
        assert engine.asked == 1 and r.held_now == WEIGHTS + COMPUTE + GiB
        assert r.in_use() == {"host": COMPUTE + GiB}  # what MemAvailable shows taken
        growing = host_room(registry, monkeypatch, tmp_path)
        assert growing == budgeted - (KV - GiB)  # the 2 GiB it may still grow into are kept
        engine.now = WEIGHTS + COMPUTE + KV  # grown to its budget: nothing more to keep
        await refresh_held_now(registry)
        assert host_room(registry, monkeypatch, tmp_path) == budgeted

    asyncio.run(scenario())


def test_an_engine_that_allocates_at_load_is_never_asked_twice_and_a_hung_one_keeps_its_last(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        registry = Registry()
        whole = resident(tmp_path, Growing(None), "whole")
        hung_engine = Growing(WEIGHTS, hang=True)
        hung = resident(tmp_path, hung_engine, "hung")
        loading = resident(tmp_path, Growing(1), "loading")
        for r in (whole, hung, loading):
            registry.add(r)
        registry.move(whole, ResidentState.READY)
        registry.move(hung, ResidentState.READY)
        hung.held_now = WEIGHTS + COMPUTE
        await refresh_held_now(registry)
        assert whole.held_now is None and whole.in_use() == {"host": KV + COMPUTE}
        assert hung_engine.asked == 1 and hung.held_now == WEIGHTS + COMPUTE  # timed out: kept
        assert loading.held_now is None  # still loading: not asked

    asyncio.run(scenario())


def test_a_stop_that_cancels_the_loop_asking_ends_it_even_when_the_answer_is_in(
    tmp_path: Path,
) -> None:
    """The sensor loop asks each tick; a box's stop cancels it. A cancel that lands just as
    the engine answered (here: in the answer itself) must end the loop: on Python 3.11 the
    ask was an ``asyncio.wait_for``, which then returned the answer and lost the cancel, and
    the loop ran on, holding the stop forever (CI's test_orphans_e2e failures)."""

    async def scenario() -> None:
        registry = Registry()
        loop_task: asyncio.Task[None] | None = None

        class CancelledAsItAnswers(Growing):
            async def held_now(self, child: object) -> int | None:
                if self.asked == 0:
                    assert loop_task is not None
                    loop_task.cancel()  # the stop, in the one turn the answer takes
                return await super().held_now(child)

        engine = CancelledAsItAnswers(WEIGHTS)
        r = resident(tmp_path, engine)
        registry.add(r)
        registry.move(r, ResidentState.READY)

        async def sensor_loop() -> None:  # box/sensors.py: ask, then wait for the next tick
            while engine.asked < 2:  # a lost cancel shows as a second ask, then it ends
                await refresh_held_now(registry)
                await asyncio.sleep(0)

        loop_task = asyncio.create_task(sensor_loop())
        with pytest.raises(asyncio.CancelledError):
            await loop_task
        assert engine.asked == 1  # never asked again after the stop

    asyncio.run(scenario())
