"""CPU claims on real engines: an engine alone borrows the reserved core; when a later
claim takes an idle engine's cores its threads really move (read back from
/proc/PID/task/*/status, Cpus_allowed_list), or, with more threads than cores left, it
starts again on fewer; when that claim ends the cores come back.

One box in this process, two tiny generated llamas, real llama-server children, every core
of the box (no cores tier: an operator's --cpu-max is never exceeded by lending).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from fitbox import config as settings
from fitbox.box.box import Box
from fitbox.box.resident import Resident
from fitbox.box.supervision.pinning import thread_ids
from fitbox.box.warmth import ROOM_CHECKS
from fitbox.engines.kinds import EngineKinds
from fitbox.engines.llama_server import LlamaServer
from fitbox.models.catalog import Catalog
from fitbox.probe.gpus import open_gpu_probe
from fitbox.probe.host import physical_cores

from .support.cpus import allowed_cpus, declare_load
from .support.ggufs import write_tiny_llama

pytestmark = pytest.mark.skipif(len(physical_cores()) < 2, reason="needs two physical cores")


def threads_on(resident: Resident) -> set[frozenset[int]]:
    """The distinct CPU sets the kernel allows the resident's threads."""
    assert resident.child is not None and resident.child.pid is not None
    pid = resident.child.pid
    return {allowed_cpus(pid, tid) for tid in thread_ids(pid)}


def _two_tinies(tmp_path: Path) -> tuple[settings.Config, Catalog]:
    root = tmp_path / "models"
    root.mkdir()
    write_tiny_llama(root / "tiny-a.gguf", seed=1)
    write_tiny_llama(root / "tiny-b.gguf", seed=2)
    config = settings.load(
        {"home": str(tmp_path / "home"), "models": str(root)}, env={"FITBOX_WAIT_TIMEOUT": "120"}
    )
    return config, Catalog(config.models, config.aliases, config.facts_cache)


def _box_on_its_cores(
    config: settings.Config, catalog: Catalog
) -> tuple[Box, dict[int, frozenset[int]], tuple[int, ...], frozenset[int]]:
    """A box on llama-server; its physical cores (each with its CPUs), their ids, all CPUs."""
    box = Box(config, catalog, open_gpu_probe(""), None, [], EngineKinds([LlamaServer()]))
    cores = box.physical_cores()
    return box, cores, tuple(sorted(cores)), frozenset().union(*cores.values())


def test_a_claim_that_takes_an_idle_engines_cores(tmp_path: Path) -> None:
    """Alone, the first engine borrows the reserved core (two threads on a 2-core box).
    The second claim takes a core from it: its two threads crowded onto the one core left
    would wait on each other's spin barriers (a 3-token call took 9 s instead of 0.05 s), so
    it starts again with one thread on the core it keeps, and both stay resident. Then the
    first leaves and loads again: its claim takes the second's core, and the second, with a
    thread for each core it keeps, really moves; when that claim ends it moves back."""
    config, catalog = _two_tinies(tmp_path)

    async def run() -> None:
        box, cores, every, cpus = _box_on_its_cores(config, catalog)
        rest = cpus - cores[0]
        declare_load(box.snapshots.busy, 0.0)  # a box known quiet lends its reserved core
        try:
            lease = await box.acquire("tiny-a")
            first = lease.resident
            lease.release()  # idle now: its cores may go to the next claim
            lent = first.cores  # read once: mypy narrows a property it sees compared
            assert lent == every  # alone: the reserved core 0 is lent, as llama-server's -t
            assert threads_on(first) == {cpus} and first.threads == len(every)

            lease = await box.acquire("tiny-b")
            second = lease.resident
            assert second.cores == every[1:]
            assert threads_on(second) == {rest}
            # the first is launched again with a thread per core it keeps (the reserved
            # one); a call for it waits for that load, the second's call goes on meanwhile
            again = await box.acquire("tiny-a")
            successor = again.resident
            assert successor is box.registry.get(first.key) and second.key in box.registry
            if len(cores[0]) >= first.threads:  # SMT: both threads fit the core it keeps
                assert successor is first and threads_on(first) == {cores[0]}
            else:
                assert successor is not first and not first.child.alive  # type: ignore[union-attr]
                assert successor.threads == 1 and successor.cores == (0,)
                assert threads_on(successor) == {cores[0]}
                assert successor.child.argv[successor.child.argv.index("-t") + 1] == "1"  # type: ignore[union-attr]
            status, _ = await successor.child.pool.get("/health")  # type: ignore[union-attr]
            assert status == 200
            again.release()
            lease.release()

            await box.supervisor.stop(successor)
            lease = await box.acquire("tiny-a")
            assert lease.resident.cores == every[1:] and second.cores == ()
            assert second.threads == 1 and threads_on(second) == {cores[0]}  # re-pinned
            status, _ = await second.child.pool.get("/health")  # type: ignore[union-attr]
            assert status == 200
            lease.release()

            await box.supervisor.stop(lease.resident)  # the claim that took its core ends
            assert second.cores == every[1:] and threads_on(second) == {rest}
            lease = await box.acquire("tiny-b")
            assert lease.resident is second
            lease.release()
        finally:
            await box.close()

    asyncio.run(run())


def test_an_engine_loaded_beside_other_work_starts_again_on_every_core(tmp_path: Path) -> None:
    """Loaded while other work kept a core's worth of the box busy, the engine is lent no
    core: one thread, core 0 left to the OS. While that work lasts it stays so; once the
    work is gone and the cores stayed free for ``ROOM_CHECKS`` checks in a row, the idle
    engine starts again with a thread per core, as llama-server started by hand would run
    (issue 14: decode 0.93-0.97x direct after a swap beside the router's loads)."""
    config, catalog = _two_tinies(tmp_path)

    async def run() -> None:
        box, cores, every, cpus = _box_on_its_cores(config, catalog)
        busy = box.snapshots.busy
        other_work = {cpu: 100.0 for cpu in cores[0]}  # a core's worth, on the reserved core

        async def checks(n: int) -> int:
            widened = 0
            for _ in range(n):
                async with box.registry.lock:
                    widened += box.warmth.widen_idle()
            return widened

        try:
            for _ in range(busy.readings):
                busy.observe(other_work, set(), engines_percent=0.0)
            lease = await box.acquire("tiny-a")
            first = lease.resident
            lease.release()
            assert first.cores == every[1:] and first.threads == len(every) - 1
            assert await checks(ROOM_CHECKS + 1) == 0  # the other work lasts: it stays

            busy.observe(dict.fromkeys(cpus, 0.0), set(), engines_percent=0.0)  # gone...
            assert not busy.busy() and await checks(ROOM_CHECKS + 1) == 0  # ...but not for long
            for _ in range(busy.readings - 1):
                busy.observe(dict.fromkeys(cpus, 0.0), set(), engines_percent=0.0)
            assert first.load_seconds is not None
            first.last_used = time.monotonic() + 3600  # called just now: a reload would delay
            assert await checks(ROOM_CHECKS + 1) == 0  # the next call by its load time
            first.last_used = time.monotonic() - first.load_seconds  # idle as long as a load
            assert await checks(ROOM_CHECKS - 1) == 0  # quiet, not yet sustained
            assert await checks(1) == 1
            lease = await box.acquire("tiny-a")  # waits for the load on every core
            successor = lease.resident
            assert successor is not first and successor is box.registry.get(first.key)
            assert not first.child.alive  # type: ignore[union-attr]
            assert successor.cores == every and successor.threads == len(every)
            assert successor.window == first.window and successor.parallel == first.parallel
            assert threads_on(successor) == {cpus}
            argv = successor.child.argv  # type: ignore[union-attr]
            assert argv[argv.index("-t") + 1] == str(len(every))
            status, _ = await successor.child.pool.get("/health")  # type: ignore[union-attr]
            assert status == 200
            lease.release()
            assert await checks(ROOM_CHECKS + 1) == 0  # it has every core: nothing more
        finally:
            await box.close()

    asyncio.run(run())


def test_busy_cores_shrink_a_claim_to_one_thread_and_an_unread_box_lends_nothing(
    tmp_path: Path,
) -> None:
    """Every core kept busy by other work (a declared reading, the reserved one too): the
    model is not refused, it gets one thread on one core (a thread per busy core waits on
    spin barriers: a 1-token chat 290-400 ms at -t 2 on two busy cores, 30-60 ms at -t 1).
    On a box whose load was never read the reserved core is not lent either."""
    config, catalog = _two_tinies(tmp_path)

    async def run() -> None:
        box, cores, every, _ = _box_on_its_cores(config, catalog)
        try:
            lease = await box.acquire("tiny-a")  # no reading yet: not known quiet
            first = lease.resident
            lease.release()
            assert first.cores == every[1:] and first.threads == len(every) - 1
            await box.supervisor.stop(first)

            declare_load(box.snapshots.busy, 100.0)
            assert box.snapshots.busy.busy() == every  # the reserved core too, box-wide
            lease = await box.acquire("tiny-b")
            busy = lease.resident
            argv = busy.child.argv  # type: ignore[union-attr]
            assert busy.cores == (every[1],) and argv[argv.index("-t") + 1] == "1"
            assert threads_on(busy) == {cores[every[1]]}
            status, _ = await busy.child.pool.get("/health")  # type: ignore[union-attr]
            assert status == 200
            lease.release()
        finally:
            await box.close()

    asyncio.run(run())
