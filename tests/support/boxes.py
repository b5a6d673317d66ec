"""A Box built in process, without an engine: the seam that never launches, the box on a
tiny catalog, residents registered as admission would register them, the waiting room."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from pathlib import Path
from typing import Any

from fitbox import config as settings
from fitbox.box.box import Box
from fitbox.box.resident import Resident
from fitbox.core.types import Footprint, ResidentState
from fitbox.engines.kinds import EngineKinds
from fitbox.engines.llama_server import LlamaServer
from fitbox.engines.seam import EngineNotFound
from fitbox.models.catalog import Catalog
from fitbox.probe.gpus import open_gpu_probe
from fitbox.store.db import Store

S = ResidentState


class NoBinary(LlamaServer):
    """llama-server's seam with no binary on the box: every launch fails before a fork."""

    def locate(self) -> None:
        raise EngineNotFound("No runnable llama-server here (pip install 'fitbox[llama]').")


def make_box(tmp_path: Path, models: Path, store: Store | None = None, **env: str) -> Box:
    config = settings.load(
        {"home": str(tmp_path / "home"), "models": str(models)},
        env={"FITBOX_WAIT_TIMEOUT": "30", **env},
    )
    catalog = Catalog(config.models, config.aliases, config.facts_cache)
    return Box(config, catalog, open_gpu_probe(""), store, [], EngineKinds([NoBinary()]))


def box_on(tmp_path: Path, worker: Path, central: Path, store: Store, **env: str) -> Box:
    """A box whose models live on two drives: ``worker`` (fast, local) and ``central``."""
    config = settings.load(
        {"home": str(tmp_path / "home"), "models": f"{worker}{os.pathsep}{central}"},
        env={"FITBOX_DRIVE_ROLES": f"{worker}=worker,{central}=central", **env},
    )
    catalog = Catalog(config.models, config.aliases, config.facts_cache)
    return Box(config, catalog, open_gpu_probe(""), store, [], EngineKinds([NoBinary()]))


def resident_of(box: Box, name: str, state: ResidentState = S.READY) -> Resident:
    """Register a resident of ``name`` as admission would, and bring it to ``state``."""
    artifact = box.catalog.resolve(name)
    resident = Resident(
        artifact=artifact,
        device="host",
        footprint=Footprint(1 << 20, 0, 0, 0),
        window=512,
        parallel=2,
        simulated=False,
        engine=box.admission.engines.for_artifact(artifact),
    )
    box.registry.add(resident)
    if state is not S.STARTING:
        box.registry.move(resident, S.READY)
        resident.ready.set_result(None)
    if state is S.STOPPING:
        box.registry.move(resident, S.STOPPING)
    return resident


async def queued(box: Box) -> list[dict[str, Any]]:
    """The waiting room once a call has entered it (the call runs at the next yields)."""
    for _ in range(1000):
        if waiting := box.queue():
            return waiting
        await asyncio.sleep(0)
    raise AssertionError("no call entered the waiting room")


def actions(store: Store) -> list[dict[str, Any]]:
    """The operator actions the store holds, every row written."""
    store.flush()
    with sqlite3.connect(store.path) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute("SELECT * FROM operator_actions ORDER BY id")]
