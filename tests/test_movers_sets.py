"""The movers on split GGUFs (real shards from the real llama-gguf-split): a set moves and
is reaped as one. A box in this process with a real store and catalog over a worker root and
a central root; residents are none (test_movers.py covers those rules for one file)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fitbox import config as settings
from fitbox.box.box import Box
from fitbox.core.reap import Kept
from fitbox.engines.kinds import EngineKinds
from fitbox.models.catalog import Catalog
from fitbox.models.copying import CopyRefused, copy_set_verified
from fitbox.probe.gpus import open_gpu_probe
from fitbox.store.db import Store

from .support.boxes import NoBinary, actions, box_on
from .support.ggufs import write_tiny_llama
from .support.splits import split_gguf

TENSORS = 11  # a tiny llama has 21: two shards


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def names(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store(tmp_path / "box.sqlite3")
    yield opened
    opened.close()


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    worker, central = tmp_path / "nvme" / "models", tmp_path / "hdd" / "models"
    worker.mkdir(parents=True)
    central.mkdir(parents=True)
    return worker, central


def split_tiny(tmp_path: Path, dest: Path, name: str, seed: int) -> list[Path]:
    """A tiny llama (its bytes from ``seed``) as the two shards ``dest/NAME-0000i-of-00002``."""
    (tmp_path / "src").mkdir(exist_ok=True)
    source = write_tiny_llama(tmp_path / "src" / f"{name}-{seed}.gguf", seed=seed)
    return split_gguf(source, dest, name, TENSORS)


def test_reap_removes_a_split_gguf_whole_and_only_when_every_shard_has_a_central_twin(
    tmp_path: Path, roots: tuple[Path, Path], store: Store
) -> None:
    """twin/: both shards on both drives, so it goes (both files). half/: shard 1's twin is
    on the central drive, shard 2's is not (the worker's has other bytes): kept whole.
    torn/: the worker holds shard 2 of 2 only: no model, never reaped in part."""
    worker, central = roots
    twin = split_tiny(tmp_path, central / "twin", "twin", seed=1)
    shutil.copytree(central / "twin", worker / "twin")
    half_central = split_tiny(tmp_path, central / "half", "half", seed=2)
    half_other = split_tiny(tmp_path, tmp_path / "other", "half", seed=3)
    (worker / "half").mkdir()
    shutil.copy2(half_central[0], worker / "half" / half_central[0].name)
    shutil.copy2(half_other[1], worker / "half" / half_other[1].name)
    assert sha256(half_other[1]) != sha256(half_central[1])
    half_central[1].unlink()  # the central drive holds no twin of the worker's shard 2
    torn = split_tiny(tmp_path, worker / "torn", "torn", seed=4)
    torn[0].unlink()
    box = box_on(
        tmp_path, worker, central, store, FITBOX_MOVERS="reap_to_fit", FITBOX_STORAGE_MAX="1"
    )

    async def run() -> None:
        catalog = box.catalog
        assert catalog.resolve("twin").path == worker / "twin" / twin[0].name
        plan = await box.movers.reap(worker, 1 << 30, "a test")
        assert [v.files for v in plan.victims] == [
            tuple(str(worker / "twin" / s.name) for s in twin)
        ]
        assert plan.freed == sum(s.stat().st_size for s in twin)
        kept = {Path(c.path).parent.name: (why, len(c.files)) for c, why in plan.kept}
        assert kept == {"half": (Kept.LAST_COPY, 2), "torn": (Kept.INCOMPLETE_SET, 1)}
        assert catalog.resolve("twin").path == twin[0]  # its central copy serves now

    asyncio.run(run())
    assert names(worker / "twin") == []
    assert len(names(worker / "half")) == 2 and len(names(worker / "torn")) == 1
    assert names(central / "twin") == [s.name for s in twin]
    (reap,) = [a for a in actions(store) if a["action"] == "reap"]
    assert reap["outcome"] == "ok" and twin[1].name in reap["detail"]


def test_copy_to_central_and_upload_move_every_shard_of_a_set(
    tmp_path: Path, roots: tuple[Path, Path], store: Store
) -> None:
    worker, central = roots
    local = split_tiny(tmp_path, worker / "local", "local", seed=5)  # worker only
    far = split_tiny(tmp_path, central / "far", "far", seed=6)  # central only
    box = box_on(tmp_path, worker, central, store, FITBOX_MOVERS="copy_to_central,upload_to_worker")

    async def run() -> None:
        dest, why = await box.movers.copy_to_central(box.catalog.resolve("local"))
        assert dest == central / "local" / local[0].name, why
        again, why = await box.movers.copy_to_central(box.catalog.resolve("local"))
        assert again is None and "twin" in why
        named = await box.movers.before_load(box.asks.named("far"), 3)
        assert named.first.path == worker / "far" / far[0].name

    asyncio.run(run())
    for shards, there in ((local, central / "local"), (far, worker / "far")):
        assert names(there) == [s.name for s in shards]  # every shard, no .part left
        for shard in shards:
            assert sha256(there / shard.name) == sha256(shard)
    outcomes = [
        (a["action"], a["outcome"])
        for a in actions(store)
        if a["action"] in ("copy-to-central", "upload-to-worker")
    ]
    assert outcomes == [("copy-to-central", "ok"), ("upload-to-worker", "ok")]


def test_a_set_is_named_only_once_every_shard_landed_and_a_bad_shard_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While any shard is still being copied no destination exists (each progress call
    looks); the renames come after, the first shard's last; a shard whose bytes are not
    the ones expected drops the whole set, the shards already copied included."""
    shards = split_tiny(tmp_path, tmp_path / "from", "set", seed=7)
    dests = [tmp_path / "to" / s.name for s in shards]
    seen: list[list[bool]] = []
    renamed: list[str] = []
    real_replace: Callable[..., None] = os.replace

    def replace(src: Path, dst: Path) -> None:
        renamed.append(Path(dst).name)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)  # copying.py's os is this one
    pairs = [(s, d, sha256(s)) for s, d in zip(shards, dests, strict=True)]
    landed = copy_set_verified(pairs, lambda n: seen.append([d.exists() for d in dests]))
    assert seen and not any(any(step) for step in seen)
    assert renamed == [d.name for d in reversed(dests)]  # the first shard named last
    assert [sha for sha, _ in landed] == [sha256(s) for s in shards]
    assert names(tmp_path / "to") == [s.name for s in shards]

    for d in dests:
        d.unlink()
    bad = [*pairs[:-1], (shards[-1], dests[-1], "00" * 32)]
    with pytest.raises(CopyRefused, match="not the 00"):
        copy_set_verified(bad)
    assert names(tmp_path / "to") == []  # shard 1's verified copy went too, and every .part
    with pytest.raises(CopyRefused, match="exists already"):
        (tmp_path / "to" / shards[1].name).write_bytes(b"in the way")
        copy_set_verified(pairs)
    assert names(tmp_path / "to") == [shards[1].name]  # what was there is left alone


def test_a_pinned_set_whose_name_answers_from_the_central_drive_is_kept(
    tmp_path: Path, roots: tuple[Path, Path], store: Store
) -> None:
    """The central root first: the catalog names the set by its central copy, so the
    worker's set is known by its file's name, the shard suffix cut (``pinned`` is by name)."""
    worker, central = roots
    split_tiny(tmp_path, central / "p", "pinned-set", seed=8)
    shutil.copytree(central / "p", worker / "p")
    config = settings.load(
        {"home": str(tmp_path / "home"), "models": f"{central}{os.pathsep}{worker}"},
        env={
            "FITBOX_DRIVE_ROLES": f"{worker}=worker,{central}=central",
            "FITBOX_MOVERS": "reap_to_fit",
            "FITBOX_STORAGE_MAX": "1",
        },
    )
    catalog = Catalog(config.models, config.aliases, config.facts_cache)
    box = Box(config, catalog, open_gpu_probe(""), store, [], EngineKinds([NoBinary()]))
    assert box.catalog.resolve("pinned-set").path.parent == central / "p"
    box.prefs.apply("pair", "pinned-set", {"pinned": True})

    plan = asyncio.run(box.movers.reap(worker, 1 << 30, "a test"))
    assert plan.victims == ()
    assert [(Path(c.path).parent, why) for c, why in plan.kept] == [(worker / "p", Kept.PINNED)]
    assert len(names(worker / "p")) == 2


def test_an_upload_stopped_between_its_renames_is_finished_not_wedged(
    tmp_path: Path, roots: tuple[Path, Path], store: Store
) -> None:
    """The worker holds shard 2 of a set and not shard 1, as a copy stopped after its
    first rename (the last shard) leaves it: the next upload copies only shard 1. A stray
    shard with other bytes is never overwritten: the call loads from the central drive."""
    worker, central = roots
    far = split_tiny(tmp_path, central / "far", "far", seed=9)
    odd = split_tiny(tmp_path, central / "odd", "odd", seed=10)
    other = split_tiny(tmp_path, tmp_path / "other", "odd", seed=11)
    (worker / "far").mkdir()
    (worker / "odd").mkdir()
    shutil.copy2(far[1], worker / "far" / far[1].name)
    shutil.copy2(other[1], worker / "odd" / other[1].name)  # same name, other bytes
    left = os.stat(worker / "far" / far[1].name)
    box = box_on(tmp_path, worker, central, store, FITBOX_MOVERS="upload_to_worker")

    async def run() -> None:
        done = await box.movers.before_load(box.asks.named("far"), None)
        assert done.first.path == worker / "far" / far[0].name
        refused = await box.movers.before_load(box.asks.named("odd"), None)
        assert refused.first.path == odd[0]

    asyncio.run(run())
    assert names(worker / "far") == [s.name for s in far]
    assert [sha256(worker / "far" / s.name) for s in far] == [sha256(s) for s in far]
    kept = os.stat(worker / "far" / far[1].name)
    assert (kept.st_ino, kept.st_mtime_ns) == (left.st_ino, left.st_mtime_ns)  # not copied
    assert names(worker / "odd") == [other[1].name]  # left alone, no .part
    assert sha256(worker / "odd" / other[1].name) == sha256(other[1])
    rows = [
        (a["target"], a["outcome"]) for a in actions(store) if a["action"] == "upload-to-worker"
    ]
    assert rows == [("far", "ok"), ("odd", "error")]
