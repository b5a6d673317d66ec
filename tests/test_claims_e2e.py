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


def test_a_claim_that_takes_an_idle_engines_core_repins_its_threads(tmp_path: Path) -> None:
    root = tmp_path / "models"
    root.mkdir()
    write_tiny_llama(root / "tiny-a.gguf", seed=1)
    write_tiny_llama(root / "tiny-b.gguf", seed=2)
    config = settings.load({"home": str(tmp_path / "home"), "models": str(root)},
                           env={"FITBOX_WAIT_TIMEOUT": "120"})  # fmt: skip
    catalog = Catalog(config.models, config.aliases, config.facts_cache)

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
            assert threads_on(first) == {cpus}

            lease = await box.acquire("tiny-b")
            second = lease.resident
            assert second.cores == every[1:]
            assert first.cores == (0,)  # it lost every core but the reserved one
            assert threads_on(second) == {rest}
            assert threads_on(first) == {cores[0]}  # every thread moved off the taken cores
            # the moved engine still answers (its threads run on the core it kept)
            status, _ = await first.child.pool.get("/health")  # type: ignore[union-attr]
            assert status == 200
            lease.release()
        finally:
            await box.close()

    asyncio.run(run())
