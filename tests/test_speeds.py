"""Measured speeds: the medians the core reads, and the bandwidth curve a claim reads (kept
in the store: a restarted box places with it)."""

from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from fitbox import config as settings
from fitbox.box.box import Box
from fitbox.box.resident import Resident
from fitbox.box.speeds import median_speeds
from fitbox.core import claims
from fitbox.core.decide import decide
from fitbox.core.decision import Place
from fitbox.core.types import Footprint
from fitbox.engines.kinds import EngineKinds
from fitbox.engines.llama_server import LlamaServer
from fitbox.engines.seam import CallTimings
from fitbox.models.catalog import Catalog
from fitbox.probe.gpus import open_gpu_probe
from fitbox.probe.host import physical_cores
from fitbox.store.db import MeasuredSpeed, Store

from .support.cpus import declare_load
from .support.ggufs import write_tiny_llama


def speed(decode_ms: float) -> MeasuredSpeed:
    return MeasuredSpeed("m", 1, 1, "ram-only", "host", 10, 2.0, 64, decode_ms, None, 0.0)


def test_the_curve_is_the_median_decode_rate_per_core_count_and_a_claim_reads_it() -> None:
    by_cores = [(1, 20.0), (1, 25.0), (1, 20.0), (2, 10.0), (2, 10.1), (2, 9.9)]
    got = median_speeds([speed(ms) for _, ms in by_cores], by_cores)
    assert got.decode_ms == pytest.approx(15.05) and got.prompt_ms == 2.0
    assert got.threads == ((1, 50.0), (2, 100.0))  # tokens/s: 1000 / the median ms
    # two cores double the rate: alone on a two-core box, it keeps both
    assert claims.claim(
        range(2), (), [], (), weights_in_ram=True, floor=1, threads=got.threads
    ) == claims.Claim((0, 1))
    flat = median_speeds([], [(1, 10.0), (2, 10.05)]).threads
    # the second core adds under 1 %: the OS keeps its core
    assert claims.claim(
        range(2), (), [], (), weights_in_ram=True, floor=1, threads=flat
    ) == claims.Claim((1,))


@pytest.mark.skipif(len(physical_cores()) < 2, reason="needs two physical cores")
def test_a_restarted_box_places_with_the_thread_curve_it_measured(tmp_path: Path) -> None:
    """A box measures its engine on one core and on two: the second adds under 1 %. After a
    restart over the same store, the claim still reads that curve and leaves the OS its core,
    where a box that never measured lends it (two cores, as llama-server by hand)."""
    root = tmp_path / "models"
    root.mkdir()
    write_tiny_llama(root / "tiny-a.gguf", seed=1)

    def box_over(store: Store | None) -> Box:
        config = settings.load({"home": str(tmp_path / "home"), "models": str(root)})
        catalog = Catalog(config.models, config.aliases, config.facts_cache)
        return Box(config, catalog, open_gpu_probe(""), store, [], EngineKinds([LlamaServer()]))

    async def measure(path: Path) -> list[int]:
        store = Store(path)
        box = box_over(store)
        declare_load(box.snapshots.busy, 0.0)  # a quiet box: an engine alone may be lent
        unmeasured = box.plan_for("tiny-a")["cores"]
        ask, _ = box.ask_for("tiny-a")
        placed = decide(box.snapshots.snapshot(), ask)
        assert isinstance(placed, Place)
        artifact = box.catalog.resolve("tiny-a")
        engine = box.engines.for_artifact(artifact)
        for cores, ms in ((1, 10.0), (2, 9.95)) * 3:  # tokens/s 100 and 100.5
            on = replace(placed, cores=tuple(range(2 - cores, 2)))
            resident = Resident(
                artifact, "host", Footprint(1, 0, 0, 0), 512, 1, False, engine, place=on
            )
            timings = CallTimings(
                prompt_n=8, prompt_per_token_ms=1.0, decode_n=64, decode_per_token_ms=ms
            )
            box.speeds.record(resident, timings, 1)
        measured = box.plan_for("tiny-a")["cores"]
        await box.close()
        store.close()
        assert measured == [1], "this process's own curve leaves the OS its core"
        return list(unmeasured)

    async def restarted(path: Path) -> list[int]:
        store = Store(path)
        box = box_over(store)
        declare_load(box.snapshots.busy, 0.0)
        try:
            artifact = box.catalog.resolve("tiny-a")
            assert box.speeds.of(artifact, "ram-only").threads == ((1, 100.0), (2, 1000 / 9.95))
            return list(box.plan_for("tiny-a")["cores"])
        finally:
            await box.close()
            store.close()

    path = tmp_path / "fitbox.sqlite3"
    assert asyncio.run(measure(path)) == [0, 1]  # never measured: the reserved core is lent
    assert asyncio.run(restarted(path)) == [1]
    with sqlite3.connect(path) as conn:  # each speed row says how many cores it ran on
        assert sorted({r[0] for r in conn.execute("SELECT cores FROM measured_speeds")}) == [1, 2]
