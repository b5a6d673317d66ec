"""Adoption's judgement on records and processes of this test's own (no engine): the
placement recorded at ready rebuilds the same resident; a record whose process is not the
one recorded is reaped or closed as gone, and never adopted."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import psutil

from fitbox.box.resident import Resident
from fitbox.box.supervision.adoption import judge, placement_of, resident_from
from fitbox.core.decision import Place
from fitbox.core.repack import RepackReason
from fitbox.core.types import Footprint, Rung
from fitbox.engines.adopted import AdoptedChild
from fitbox.engines.orphans import ChildRecord
from fitbox.engines.seam import Engine
from fitbox.models.catalog import Artifact
from fitbox.store.db import Store

from .support.boxes import box_on
from .support.ggufs import write_tiny_llama

PLACE = Place(
    artifact="tiny",
    rung=Rung.RAM_ONLY,
    window=1024,
    type_k="q8_0",
    type_v="f16",
    devices=("host",),
    footprint=(("host", Footprint(1000, 200, 30, 4)),),
    gpu_layers=0,
    tensor_split=(),
    experts_in_ram=False,
    victims=(),
    cores=(0, 1),
    where="host",
    repack=RepackReason.RAM_BOUND,
    slots=3,
    kv_unified=True,
)


def test_the_recorded_placement_rebuilds_the_same_resident(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    write_tiny_llama(models / "tiny.gguf")
    store = Store(tmp_path / "box.sqlite3")
    try:
        box = box_on(tmp_path, models, tmp_path / "none", store)

        async def run() -> None:
            artifact = box.catalog.resolve("tiny")
            engine = box.admission.engines.for_artifact(artifact)
            before = Resident(
                artifact=artifact,
                device="host",
                footprint=Footprint(1000, 200, 30, 4),
                window=1024,
                parallel=3,
                simulated=False,
                engine=engine,
                basis="measured",
                held={"host": 1234},
                asked="tiny",
                band=2,
                pinned=True,
                load_seconds=0.5,
                place=PLACE,
            )
            data = json.loads(json.dumps(placement_of(before)))  # as the store keeps it
            child = AdoptedChild(["x"], 1, tmp_path / "log", 1, 0.0)
            after = resident_from(data, artifact, engine, child)
            assert after.place == PLACE
            for field in ("device", "footprint", "window", "parallel", "basis", "held"):
                assert getattr(after, field) == getattr(before, field), field
            assert (after.pinned, after.band, after.asked) == (True, 2, "tiny")
            assert after.cores == (0, 1) and after.slots == before.slots
            assert after.child is child

        asyncio.run(run())
    finally:
        store.close()


def never_found(path: str) -> Artifact | None:
    return None


def no_engine(artifact: Artifact) -> Engine:
    raise AssertionError("a record that fails its checks never gets an engine")


def no_log(artifact: Artifact, port: int) -> Path:
    raise AssertionError("a record that fails its checks never gets a log")


def test_a_process_that_is_not_the_recorded_engine_is_reaped_never_adopted(
    tmp_path: Path,
) -> None:
    """Alive with the recorded pid and start time but another command line: reaped. A pid
    whose start time differs (reused): closed as gone, left alone."""
    ours = subprocess.Popen(["sleep", "300"], start_new_session=True)
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        started = psutil.Process(ours.pid).create_time()
        tampered = ChildRecord(
            1, ours.pid, started, ("sleep", "301"), 1, "/m.gguf", {"device": "host"}
        )
        reused = ChildRecord(
            2, stranger.pid, psutil.Process(stranger.pid).create_time() - 100, ("sleep", "300")
        )
        gone = judge(reused, never_found, no_engine, no_log, {})
        assert (gone.how, gone.resident) == ("gone", None) and stranger.poll() is None
        reaped = judge(tampered, never_found, no_engine, no_log, {})
        assert (reaped.how, reaped.resident) == ("reaped at start", None)
        assert ours.poll() is not None  # stopped
    finally:
        for proc in (ours, stranger):
            if proc.poll() is None:
                proc.kill()
            proc.wait()
