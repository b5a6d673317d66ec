"""The movers (box/movers.py) on real files in a real directory tree: a worker root and a
central root, their roles set, tiny real GGUFs; a box in this process with a real store.
Residents are registered by the test, as admission would register them (no engine)."""

from __future__ import annotations

import asyncio
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fitbox.box import movers
from fitbox.box.box import Box
from fitbox.box.resident import Resident
from fitbox.core.reap import Kept
from fitbox.core.types import Footprint, ResidentState
from fitbox.models.copying import CopyRefused, copy_set_verified
from fitbox.store.db import Store

from .support.boxes import actions, box_on
from .support.ggufs import write_tiny_llama

S = ResidentState


@pytest.fixture
def drives(tmp_path: Path) -> tuple[Path, Path]:
    """worker/: copies of a, b, c (each with its twin in central/) and d (worker only)."""
    worker, central = tmp_path / "nvme" / "models", tmp_path / "hdd" / "models"
    worker.mkdir(parents=True)
    central.mkdir(parents=True)
    for seed, name in enumerate("abc", 1):
        write_tiny_llama(central / f"tiny-{name}.gguf", seed=seed)
        shutil.copy2(central / f"tiny-{name}.gguf", worker / f"tiny-{name}.gguf")
    write_tiny_llama(worker / "tiny-d.gguf", seed=4)
    return worker, central


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store(tmp_path / "box.sqlite3")
    yield opened
    opened.close()


def called(store: Store, path: Path, at: float) -> None:
    store.run(
        lambda conn: conn.execute(
            "INSERT INTO call_log (request_id, endpoint, artifact, received_at, outcome) "
            "VALUES ('r', '/v1/chat/completions', ?, ?, 'ok')",
            (str(path), at),
        )
    )


def resident_of(box: Box, name: str) -> Resident:
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
    box.registry.move(resident, S.READY)
    resident.ready.set_result(None)
    return resident


def test_reap_removes_least_recently_called_twins_and_never_a_resident_or_last_copy(
    tmp_path: Path, drives: tuple[Path, Path], store: Store
) -> None:
    worker, central = drives
    size = (worker / "tiny-a.gguf").stat().st_size
    held = sum(p.stat().st_size for p in worker.iterdir())
    # the budget leaves half a file of room: one more file needs one copy gone
    box = box_on(
        tmp_path,
        worker,
        central,
        store,
        FITBOX_MOVERS="reap_to_fit",
        FITBOX_STORAGE_MAX=str(held + size // 2),
    )
    for at, name in enumerate("abcd", 1):  # a is the least recently called, d the most
        called(store, worker / f"tiny-{name}.gguf", 100.0 * at)

    async def run() -> None:
        resident_of(box, "tiny-a")  # the least recently called, and resident: kept
        first = await box.movers.reap(worker, size, "a test")
        assert [Path(c.path).name for c in first.victims] == ["tiny-b.gguf"]
        assert first.short_by == 0
        kept = {Path(c.path).name: why for c, why in first.kept}
        assert kept["tiny-a.gguf"] is Kept.RESIDENT
        assert kept["tiny-d.gguf"] is Kept.LAST_COPY
        assert kept["tiny-c.gguf"] is Kept.NOT_NEEDED
        # the catalog answers for b from its central copy now
        assert box.catalog.resolve("tiny-b").path == central / "tiny-b.gguf"
        # far more than there is: c goes; a (resident) and d (the only copy) never do
        second = await box.movers.reap(worker, 10 * size, "a test")
        assert [Path(c.path).name for c in second.victims] == ["tiny-c.gguf"]
        assert second.short_by > 0

    asyncio.run(run())
    assert sorted(p.name for p in worker.iterdir()) == ["tiny-a.gguf", "tiny-d.gguf"]
    assert sorted(p.name for p in central.iterdir()) == [f"tiny-{n}.gguf" for n in "abc"]
    reaps = [a for a in actions(store) if a["action"] == "reap"]
    assert [(Path(a["target"]).name, a["outcome"]) for a in reaps] == [
        ("tiny-b.gguf", "ok"),
        ("tiny-c.gguf", "ok"),
    ]
    assert '"why": "a test"' in reaps[0]["detail"]


def test_reap_keeps_a_serving_and_a_pinned_copy(
    tmp_path: Path, drives: tuple[Path, Path], store: Store
) -> None:
    worker, central = drives
    box = box_on(
        tmp_path, worker, central, store, FITBOX_MOVERS="reap_to_fit", FITBOX_STORAGE_MAX="1"
    )
    box.prefs.apply("pair", "tiny-c", {"pinned": True})  # pinned, not loaded

    async def run() -> None:
        serving = resident_of(box, "tiny-b")
        box.registry.join(serving)
        plan = await box.movers.reap(worker, 1 << 30, "a test")
        kept = {Path(c.path).name: why for c, why in plan.kept}
        assert kept == {
            "tiny-b.gguf": Kept.SERVING,
            "tiny-c.gguf": Kept.PINNED,
            "tiny-d.gguf": Kept.LAST_COPY,
        }
        assert [Path(c.path).name for c in plan.victims] == ["tiny-a.gguf"]

    asyncio.run(run())
    assert sorted(p.name for p in worker.iterdir()) == ["tiny-b.gguf", "tiny-c.gguf", "tiny-d.gguf"]


def test_copy_to_central_copies_a_worker_only_model_once(
    tmp_path: Path, drives: tuple[Path, Path], store: Store
) -> None:
    worker, central = drives
    box = box_on(tmp_path, worker, central, store, FITBOX_MOVERS="copy_to_central")

    async def run() -> None:
        only = box.catalog.resolve("tiny-d")
        dest, _ = await box.movers.copy_to_central(only)
        assert dest == central / "tiny-d.gguf"
        assert dest.read_bytes() == (worker / "tiny-d.gguf").read_bytes()
        twin = box.catalog.resolve("tiny-a")  # a twin is on the central drive already
        assert (await box.movers.copy_to_central(twin))[0] is None
        again, why = await box.movers.copy_to_central(only)  # now it has one too
        assert again is None and "twin" in why

    asyncio.run(run())
    rows = [a for a in actions(store) if a["action"] == "copy-to-central"]
    assert [(r["target"], r["outcome"]) for r in rows] == [("tiny-d", "ok")]
    assert not list(central.glob("*.part"))


def test_a_copy_whose_bytes_are_not_the_hashed_ones_is_dropped(tmp_path: Path) -> None:
    src = write_tiny_llama(tmp_path / "src.gguf", seed=9)
    dest = tmp_path / "out" / "src.gguf"
    with pytest.raises(CopyRefused, match="not the 00"):
        copy_set_verified([(src, dest, "00" * 32)])
    assert not dest.exists() and not list(dest.parent.iterdir())
    ((digest, chunks),) = copy_set_verified([(src, dest, None)])
    assert dest.read_bytes() == src.read_bytes() and len(chunks) == 1 and len(digest) == 64
    with pytest.raises(CopyRefused, match="exists already"):
        copy_set_verified([(src, dest, None)])


def test_a_call_waits_on_its_upload_and_the_queue_shows_it(
    tmp_path: Path, drives: tuple[Path, Path], store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy is held by an event the test sets, so the queue is read while it runs."""
    worker, central = drives
    write_tiny_llama(central / "tiny-e.gguf", seed=6)
    box = box_on(tmp_path, worker, central, store, FITBOX_MOVERS="upload_to_worker")
    gate = threading.Event()
    real_copy = copy_set_verified

    def held_copy(*args: Any) -> list[tuple[str, tuple[str, ...]]]:
        assert gate.wait(60), "the test never opened the gate"
        return real_copy(*args)

    monkeypatch.setattr(movers, "copy_set_verified", held_copy)

    async def run() -> None:
        named = box.asks.named("tiny-e")
        assert named.first.path == central / "tiny-e.gguf"
        first = asyncio.create_task(box.movers.before_load(named, 7))
        second = asyncio.create_task(box.movers.before_load(named, 8))
        for _ in range(1000):
            queue = box.queue()
            if queue and queue[0]["call_ids"] == [7, 8]:
                break
            await asyncio.sleep(0.01)
        (uploading,) = box.queue()  # one copy for both calls
        assert uploading["state"] == "uploading" and uploading["model"] == "tiny-e"
        assert uploading["to"] == str(worker / "tiny-e.gguf")
        gate.set()
        for done in await asyncio.gather(first, second):
            assert done.first.path == worker / "tiny-e.gguf"
        assert box.queue() == []
        # the catalog found the copy; a later call loads it with no copy made
        assert box.catalog.resolve("tiny-e").path == worker / "tiny-e.gguf"

    asyncio.run(run())
    assert (worker / "tiny-e.gguf").read_bytes() == (central / "tiny-e.gguf").read_bytes()
    rows = [a for a in actions(store) if a["action"] == "upload-to-worker"]
    assert [(r["target"], r["outcome"]) for r in rows] == [("tiny-e", "ok")]


def test_an_upload_with_no_room_loads_from_the_central_drive(
    tmp_path: Path, drives: tuple[Path, Path], store: Store
) -> None:
    worker, central = drives
    write_tiny_llama(central / "tiny-e.gguf", seed=6)
    box = box_on(
        tmp_path, worker, central, store, FITBOX_MOVERS="upload_to_worker", FITBOX_STORAGE_MAX="1"
    )  # no reap_to_fit: nothing is removed to make room

    async def run() -> None:
        named = await box.movers.before_load(box.asks.named("tiny-e"), None)
        assert named.first.path == central / "tiny-e.gguf"

    asyncio.run(run())
    assert not (worker / "tiny-e.gguf").exists()
    assert len(list(worker.iterdir())) == 4  # nothing reaped
    (row,) = [a for a in actions(store) if a["action"] == "upload-to-worker"]
    assert row["outcome"] == "error" and "room" in row["detail"]
