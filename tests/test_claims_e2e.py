"""CPU claims on real engines: an engine alone borrows the reserved core, and when a later
claim takes an idle engine's cores its threads really move (read back from
/proc/PID/task/*/status, Cpus_allowed_list).

One box in this process, two tiny generated llamas, real llama-server children, every core
of the box (no cores tier: an operator's --cpu-max is never exceeded by lending).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from fitbox import config as settings
from fitbox.box.box import Box
from fitbox.box.resident import Resident
from fitbox.box.supervision.pinning import allowed_cpus, thread_ids
from fitbox.engines.kinds import EngineKinds
from fitbox.engines.llama_server import LlamaServer
from fitbox.models.catalog import Catalog
from fitbox.probe.gpus import open_gpu_probe
from fitbox.probe.host import physical_cores

from .ggufs import write_tiny_llama

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
    config = settings.load({"home": str(tmp_path / "home"), "models": str(root)},
                           env={"FITBOX_WAIT_TIMEOUT": "120"})  # fmt: skip
    return config, Catalog(config.models, config.aliases, config.facts_cache)


def test_a_claim_that_takes_an_idle_engines_cores(tmp_path: Path) -> None:
    """Alone, the first engine borrows the reserved core (two threads on a 2-core box).
    The second claim takes a core from it: its threads crowded onto the one core left would
    wait on each other's spin barriers (a 3-token call took 9 s instead of 0.05 s), so they
    keep the CPUs they had. Then the first leaves and loads again: its claim takes the
    second's core, and the second, with a thread for each core it keeps, really moves."""
    config, catalog = _two_tinies(tmp_path)

    async def run() -> None:
        box = Box(config, catalog, open_gpu_probe(""), None, [], EngineKinds([LlamaServer()]))
        cores = box.physical_cores()
        every = tuple(sorted(cores))
        cpus = frozenset().union(*cores.values())
        rest = cpus - cores[0]
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
            assert first.cores == (0,)  # it lost every core but the reserved one
            assert first.threads == 2 and threads_on(first) == {cpus}  # not crowded onto 0
            assert first.key in box.registry
            status, _ = await first.child.pool.get("/health")  # type: ignore[union-attr]
            assert status == 200
            lease.release()

            await box.supervisor.stop(first)
            lease = await box.acquire("tiny-a")
            assert lease.resident.cores == every[1:] and second.cores == ()
            kept = cores[0] if second.threads == 1 else cpus - cores[0]  # crowded: it stays
            assert threads_on(second) == {kept}
            status, _ = await second.child.pool.get("/health")  # type: ignore[union-attr]
            assert status == 200
            lease.release()
        finally:
            await box.close()

    asyncio.run(run())
