"""Movers: weight files moved between the drives of this box, each off unless named in the
``movers`` setting (setting_values.py ``MOVERS``).

- ``reap_to_fit``: when a pull or an upload needs room on the worker drive (or an operator
  asks), core/reap.py chooses the least recently called worker copies with an exact twin
  (same sha256) on a central drive; they are removed under the placement lock (so no load
  can start on one meanwhile), each removal an ``operator_actions`` row, the catalog
  refreshed.
- ``upload_to_worker``: a call's model whose file is on a central drive is copied to the
  worker drive before it loads (models/copying.py: verified, atomic), and the load reads
  the copy. The call waits on the copy as on a load; /v1/queue shows it ``uploading``.
- ``copy_to_central``: a model only on the worker drive is copied to a central drive in the
  background after its first load (or as an operator action), so a reap can free it later.

Drives are the model roots, each with its role (box/drives.py). A root's copies are the
GGUFs stored under it (a link is not a copy: its bytes are elsewhere). A split GGUF's shards
are one copy and move as one (core/reap.py ``copies_of``, models/copying.py
``copy_set_verified``): every shard copied and verified before any is renamed, the first
(the name the catalog lists) renamed last; reaped whole, the first shard removed first.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fitbox.config import Config
from fitbox.core.reap import Copy, Drive, DriveRole, ReapPlan, StoredFile, copies_of, reap_to_fit
from fitbox.core.shard_names import shard_of_stem
from fitbox.models.catalog import Artifact, Catalog
from fitbox.models.copying import CopyRefused, copy_set_verified
from fitbox.models.transfer import CHUNK_BYTES, hash_file, set_files
from fitbox.probe.disk import read_drive
from fitbox.store import hashes
from fitbox.store.db import Store
from fitbox.store.hashes import KeptHash
from fitbox.units import format_bytes

from .asks import Named
from .drives import role_of
from .preferences import Preferences
from .residents import Registry
from .tasks import Tasks
from .transfers import bytes_under

log = logging.getLogger(__name__)


@dataclass
class Upload:
    """One copy to the worker drive in flight; the calls waiting on it."""

    model: str
    source: Path
    dest: Path
    size: int  # every file of it (a split GGUF's shards)
    since: float = field(default_factory=time.time)
    done_bytes: int = 0
    call_ids: list[int | None] = field(default_factory=list)
    finished: asyncio.Future[Path | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    def view(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "state": "uploading",
            "call_ids": self.call_ids,
            "since": self.since,
            "from": str(self.source),
            "to": str(self.dest),
            "bytes": self.size,
            "bytes_done": self.done_bytes,
        }


class Movers:
    def __init__(
        self,
        config: Config,
        catalog: Catalog,
        registry: Registry,
        prefs: Preferences,
        store: Store | None,
        tasks: Tasks,
    ) -> None:
        self.config, self.catalog, self.registry = config, catalog, registry
        self.prefs, self.store, self.tasks = prefs, store, tasks
        self.uploads: dict[Path, Upload] = {}
        # worker copies just uploaded: kept from a reap until their load had time to start
        self._uploaded_at: dict[str, float] = {}
        self._copying: set[Path] = set()  # sources being copied to a central drive

    def on(self, mover: str) -> bool:
        return mover in self.config.movers and self.store is not None

    # -- drives and copies -----------------------------------------------------------------

    def roles(self) -> list[tuple[Path, DriveRole]]:
        roots = list(self.catalog.roots)
        return [(r, role_of(r, roots, self.config.drive_roles)[0]) for r in roots if r.is_dir()]

    def root_with(self, role: DriveRole) -> Path | None:
        return next((root for root, r in self.roles() if r is role), None)

    def root_of(self, path: Path) -> tuple[Path, DriveRole] | None:
        """The model root a file is stored under (the deepest one holding it)."""
        real = path.resolve()
        holding = [
            (root, role) for root, role in self.roles() if real.is_relative_to(root.resolve())
        ]
        return max(holding, key=lambda pair: len(pair[0].parts), default=None)

    def kept_hash(self, path: Path) -> KeptHash:
        """The file's sha256, hashed once and kept while it keeps its size and mtime."""
        assert self.store is not None
        real, st = path.resolve(), os.stat(path)
        found: KeptHash | None = self.store.run(
            lambda conn: hashes.find(conn, str(real), st.st_size, st.st_mtime_ns, CHUNK_BYTES)
        )
        if found is not None:
            return found
        hashed = hash_file(real, CHUNK_BYTES)
        kept = KeptHash(
            str(real),
            st.st_size,
            st.st_mtime_ns,
            hashed.sha256,
            CHUNK_BYTES,
            hashed.chunks,
            time.time(),
            hashed.seconds,
        )
        self.store.run(lambda conn: hashes.keep(conn, kept))
        return kept

    def _keep(self, path: Path, sha256: str, chunks: tuple[str, ...]) -> None:
        assert self.store is not None
        st = os.stat(path)
        kept = KeptHash(
            str(path.resolve()),
            st.st_size,
            st.st_mtime_ns,
            sha256,
            CHUNK_BYTES,
            chunks,
            time.time(),
            None,
        )
        self.store.run(lambda conn: hashes.keep(conn, kept))

    def _last_called(self) -> dict[str, float]:
        assert self.store is not None
        rows = self.store.run(
            lambda conn: conn.execute(
                "SELECT artifact, MAX(received_at) FROM call_log WHERE artifact IS NOT NULL "
                "GROUP BY artifact"
            ).fetchall()
        )
        return {str(path): float(at) for path, at in rows}

    def drives_and_copies(self) -> tuple[list[Drive], list[Copy]]:
        """Every root as a drive and every stored GGUF under it as a copy, hashed (blocks:
        call it off the event loop). Residents are marked later, under the lock."""
        storage_max = self.prefs.cap("storage_max")
        drives = []
        for root, role in self.roles():
            budget = storage_max if role is DriveRole.WORKER else None
            drives.append(Drive(str(root), role, read_drive(root).free, bytes_under(root), budget))
        files = []
        for root, path in self._stored_ggufs():
            try:
                sha256, size = self.kept_hash(path).sha256, os.stat(path).st_size
            except OSError:
                continue
            files.append(StoredFile(str(path), str(root), size, sha256))
        return drives, copies_of(files, self._last_called())

    def _stored_ggufs(self) -> Iterator[tuple[Path, Path]]:
        """(root, file) for each GGUF stored under a root: a link is no copy (its bytes are
        elsewhere), hidden names and ``.part`` staging are none either. A name the catalog
        serves from another root (a central twin) is a copy all the same."""
        for root, _role in self.roles():
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
                for name in sorted(filenames):
                    path = Path(dirpath) / name
                    if (
                        name.endswith(".gguf")
                        and not name.startswith(".")
                        and not path.is_symlink()
                        and path.is_file()
                    ):
                        yield root, path

    def _live(self, copies: list[Copy]) -> list[Copy]:
        """Copies marked resident, serving and pinned as the registry and settings say now
        (read under the placement lock: nothing can start loading one meanwhile)."""
        residents = {r.key: r for r in self.registry}
        names = {str(a.path): a.name for a in self.catalog.artifacts()}
        marked = []
        for copy in copies:
            resident = residents.get(copy.path)
            # a copy the catalog does not list (its name is served from another root): the
            # name its file gives, a split GGUF's without the shard suffix
            stem = Path(copy.path).name.removesuffix(".gguf")
            shard = shard_of_stem(stem) if copy.shards else None
            name = names.get(copy.path, shard.base if shard else stem)
            pinned = bool(self.prefs.pairs.get(name, {}).get("pinned"))
            uploaded = self._uploaded_at.get(copy.path, float("-inf"))
            pinned |= time.monotonic() - uploaded < self.config.load_timeout  # its call loads it
            marked.append(
                replace(
                    copy,
                    resident=resident is not None,
                    serving=bool(resident and resident.calls),
                    pinned=pinned or bool(resident and resident.pinned),
                )
            )
        return marked

    # -- reap_to_fit -----------------------------------------------------------------------

    async def reap(
        self, root: Path, need: int, why: str, origin: str | None = None, key_id: str | None = None
    ) -> ReapPlan:
        """Free ``need`` bytes on the worker root ``root``: the victims core/reap.py names,
        removed; each removal recorded. Returns the plan (``short_by`` > 0: not enough)."""
        assert self.store is not None
        drives, copies = await asyncio.to_thread(self.drives_and_copies)
        async with self.registry.lock:
            plan = reap_to_fit(drives, self._live(copies), str(root), need)
            for victim in plan.victims:
                try:  # a split GGUF's first shard first: the catalog stops naming it at once
                    for path in victim.files:
                        os.unlink(path)
                except OSError as exc:
                    self.store.operator_action(
                        "reap", victim.path, origin, key_id, "error", f"could not remove it: {exc}"
                    )
                    continue
                detail = {
                    "why": why,
                    "bytes": victim.bytes,
                    "sha256": victim.sha256,
                    "last_called": victim.last_called,
                    "need": need,
                }
                if victim.shards:
                    detail["files"] = list(victim.files)
                self.store.operator_action(
                    "reap", victim.path, origin, key_id, "ok", json.dumps(detail)
                )
                log.info("reaped %s (%s): %s", victim.path, format_bytes(victim.bytes), why)
            if plan.victims:
                self.catalog.refresh()
        return plan

    def room_on(self, root: Path) -> int:
        """Bytes that fit on ``root`` now: its drive's free bytes, within storage_max for the
        worker drive."""
        room = read_drive(root).free
        limit = self.prefs.cap("storage_max")
        if limit is not None and (root, DriveRole.WORKER) in self.roles():
            room = min(room, limit - bytes_under(root))
        return max(0, room)

    # -- upload_to_worker ------------------------------------------------------------------

    async def before_load(self, named: Named, call_id: int | None) -> Named:
        """``named`` with each variant whose file is on a central drive replaced by its
        worker copy, made now if need be (the call waits here). A copy that cannot be made
        (no room, a refused copy) leaves the variant on its central drive, said in the log."""
        if not self.on("upload_to_worker"):
            return named
        worker = self.root_with(DriveRole.WORKER)
        if worker is None:
            return named
        artifacts = []
        for artifact in named.artifacts:
            copy = await self._worker_copy(artifact, worker, call_id)
            artifacts.append(replace(artifact, path=copy) if copy else artifact)
        return Named(named.asked, named.pins, tuple(artifacts))

    async def _worker_copy(
        self, artifact: Artifact, worker: Path, call_id: int | None
    ) -> Path | None:
        held = self.root_of(artifact.path)
        if held is None or held[1] is not DriveRole.CENTRAL or not _movable(artifact):
            return None
        dest = worker / artifact.path.resolve().relative_to(held[0].resolve())
        upload = self.uploads.get(dest)
        if upload is None:
            if dest.is_file():
                same = await asyncio.to_thread(self._same_bytes, artifact.path, dest)
                return dest if same else None
            try:
                size = sum(path.stat().st_size for path in set_files(artifact.path))
            except OSError as exc:  # a shard missing: no model to copy (nor to load)
                log.warning("%s is not uploaded: %s", artifact.name, exc)
                return None
            upload = Upload(artifact.name, artifact.path, dest, size)
            self.uploads[dest] = upload
            self.tasks.spawn(self._upload(upload, worker))
        upload.call_ids.append(call_id)
        return await asyncio.shield(upload.finished)

    def _same_bytes(self, a: Path, b: Path) -> bool:
        """Whether every file of the model at ``a`` has its twin at ``b`` (shard by shard)."""
        try:
            return all(
                self.kept_hash(x).sha256 == self.kept_hash(y).sha256
                for x, y in zip(set_files(a), set_files(b), strict=True)
            )
        except OSError:
            return False

    def _copy_model(
        self, source: Path, dest: Path, progress: Callable[[int], None] | None = None
    ) -> str:
        """Every file of the model at ``source`` (a split GGUF's shards) copied beside
        ``dest`` as one (models/copying.py), each checked against its kept sha256 and its
        hash kept at the copy; the first file's sha256. Blocks: call it off the loop."""
        first, *rest = [
            (src, dst, self.kept_hash(src).sha256)
            for src, dst in zip(set_files(source), set_files(dest), strict=True)
        ]
        # a later shard already there with its source's bytes (a copy stopped between its
        # renames, before the first's) is kept, not copied again; one with other bytes
        # refuses the copy (copy_set_verified: it exists)
        pairs = [first, *(pair for pair in rest if not self._is_twin(pair[1], pair[2]))]
        landed = copy_set_verified(pairs, progress)
        for (_src, dst, _expected), (sha256, chunks) in zip(pairs, landed, strict=True):
            self._keep(dst, sha256, chunks)
        return landed[0][0]

    def _is_twin(self, path: Path, sha256: str) -> bool:
        try:
            return path.is_file() and self.kept_hash(path).sha256 == sha256
        except OSError:
            return False

    async def _upload(self, upload: Upload, worker: Path) -> None:
        assert self.store is not None
        result: Path | None = None
        try:
            if self.room_on(worker) < upload.size and self.on("reap_to_fit"):
                await self.reap(worker, upload.size, f"room to upload {upload.model}")
            room = self.room_on(worker)
            if room < upload.size:
                raise CopyRefused(
                    f"the worker drive {worker} has {format_bytes(room)} room, "
                    f"{upload.model} needs {format_bytes(upload.size)}"
                )

            def progress(n: int) -> None:
                upload.done_bytes += n

            sha256 = await asyncio.to_thread(self._copy_model, upload.source, upload.dest, progress)
            self._uploaded_at[str(upload.dest)] = time.monotonic()
            self.store.operator_action(
                "upload-to-worker",
                upload.model,
                None,
                None,
                "ok",
                json.dumps({"from": str(upload.source), "to": str(upload.dest), "sha256": sha256}),
            )
            self.catalog.refresh()
            result = upload.dest
        except (CopyRefused, OSError) as exc:
            log.warning("%s loads from its central drive: not uploaded (%s)", upload.model, exc)
            self.store.operator_action(
                "upload-to-worker", upload.model, None, None, "error", str(exc)
            )
        finally:
            self.uploads.pop(upload.dest, None)
            if not upload.finished.done():
                upload.finished.set_result(result)

    def queue(self) -> list[dict[str, Any]]:
        return [u.view() for u in self.uploads.values()]

    # -- copy_to_central -------------------------------------------------------------------

    def after_load(self, artifact: Artifact) -> None:
        """After a model's load: an uploaded copy is no longer kept from a reap for it (its
        resident is, while it lasts); a worker-only file is copied to a central drive, in
        the background."""
        self._uploaded_at.pop(str(artifact.path), None)
        if self.on("copy_to_central"):
            self.tasks.spawn(self.copy_to_central(artifact))

    async def copy_to_central(self, artifact: Artifact) -> tuple[Path | None, str]:
        """Copy a worker-only file to the central drive: (its path there, or None; why).
        A copy refused is said in the log and an ``operator_actions`` row."""
        assert self.store is not None
        central, held = self.root_with(DriveRole.CENTRAL), self.root_of(artifact.path)
        if central is None:
            return None, "no model root is on a central drive"
        if held is None or held[1] is not DriveRole.WORKER:
            return None, f"{artifact.path} is not stored on the worker drive"
        if not _movable(artifact):
            return None, "only a GGUF model is moved (a transformers folder is not)"
        if artifact.path in self._copying:
            return None, "it is being copied already"
        dest = central / artifact.path.resolve().relative_to(held[0].resolve())
        self._copying.add(artifact.path)
        try:
            files = set_files(artifact.path)
            sha256s = [(await asyncio.to_thread(self.kept_hash, f)).sha256 for f in files]
            if all([await asyncio.to_thread(self._twin_on_central, h) for h in sha256s]):
                return None, "its exact twin (same sha256) is on a central drive already"
            if dest.exists():
                if await asyncio.to_thread(self._same_bytes, artifact.path, dest):
                    return None, f"its exact twin (same sha256) is {dest} already"
                raise CopyRefused(f"{dest} exists with other bytes; nothing was copied")
            size, free = sum(f.stat().st_size for f in files), read_drive(central).free
            if free < size:
                raise CopyRefused(
                    f"the central drive {central} has {format_bytes(free)} "
                    f"free, {artifact.name} needs {format_bytes(size)}"
                )
            sha256 = await asyncio.to_thread(self._copy_model, artifact.path, dest)
        except (CopyRefused, OSError) as exc:
            log.warning("%s was not copied to the central drive: %s", artifact.name, exc)
            self.store.operator_action(
                "copy-to-central", artifact.name, None, None, "error", str(exc)
            )
            return None, str(exc)
        finally:
            self._copying.discard(artifact.path)
        self.store.operator_action(
            "copy-to-central",
            artifact.name,
            None,
            None,
            "ok",
            json.dumps({"from": str(artifact.path), "to": str(dest), "sha256": sha256}),
        )
        return dest, "copied, sha256 verified"

    def _twin_on_central(self, sha256: str) -> bool:
        """Whether a file with this sha256 is already stored on a central drive."""
        assert self.store is not None
        for kept in self.store.run(lambda conn: hashes.with_sha256(conn, sha256)):
            held = self.root_of(Path(kept.path))
            if held is None or held[1] is not DriveRole.CENTRAL:
                continue
            try:
                st = os.stat(kept.path)
            except OSError:
                continue
            if (st.st_size, st.st_mtime_ns) == (kept.size, kept.mtime_ns):
                return True
        return False


def _movable(artifact: Artifact) -> bool:
    """A GGUF model moves: one file, or a split GGUF's shards together (a transformers
    folder does not: its files are not GGUFs the drives' copies count)."""
    return artifact.format == "gguf"
