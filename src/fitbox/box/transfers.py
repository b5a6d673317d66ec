"""Transfers between boxes, on this box's side.

- As a source: the kept hash of each file it offers (models/transfer.py), hashed once and
  kept in the store (``file_hashes``) while the file keeps its size and mtime; one hashing
  per file at a time, whoever asks.
- As a destination: a pull from ``box://HOST:PORT/MODEL`` (models/box_pull.py) into a model
  root, refused when the same bytes are already here (by the kept hashes) or when the
  storage tier has no room; every file a ``pulls`` row; each landed file's hash kept.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from fitbox.models.box_pull import BoxPull, Events, FileOutcome, parse_box_spec
from fitbox.models.pull import PullError
from fitbox.models.transfer import CHUNK_BYTES, OfferedFile, hash_file
from fitbox.probe.disk import read_drive
from fitbox.store import hashes
from fitbox.store.db import Store
from fitbox.store.hashes import KeptHash
from fitbox.units import format_bytes


class HashKeeper:
    """The kept hashes of offered files. ``kept`` blocks while hashing: call it off the loop."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._guard = threading.Lock()
        self._hashing: dict[str, threading.Lock] = {}

    def _lock_for(self, path: str) -> threading.Lock:
        with self._guard:
            return self._hashing.setdefault(path, threading.Lock())

    def kept(self, offered: OfferedFile) -> KeptHash:
        real = str(offered.real)
        with self._lock_for(real):
            found: KeptHash | None = self.store.run(
                lambda conn: hashes.find(conn, real, offered.size, offered.mtime_ns, CHUNK_BYTES)
            )
            if found is not None:
                return found
            hashed = hash_file(offered.real, CHUNK_BYTES)
            kept = KeptHash(
                real,
                offered.size,
                offered.mtime_ns,
                hashed.sha256,
                CHUNK_BYTES,
                hashed.chunks,
                time.time(),
                hashed.seconds,
            )
            st = os.stat(offered.real)
            if (st.st_size, st.st_mtime_ns) == (offered.size, offered.mtime_ns):
                self.store.run(lambda conn: hashes.keep(conn, kept))  # else: it changed meanwhile
            return kept


def same_bytes_here(store: Store, sha256: str) -> Path | None:
    """A file on this box with this sha256, still as it was when hashed."""
    for kept in store.run(lambda conn: hashes.with_sha256(conn, sha256)):
        try:
            st = os.stat(kept.path)
        except OSError:
            continue
        if (st.st_size, st.st_mtime_ns) == (kept.size, kept.mtime_ns):
            return Path(kept.path)
    return None


def bytes_under(root: Path) -> int:
    """What the files under ``root`` hold (links not followed: a linked model is elsewhere)."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total


def no_room(dest_dir: Path, needed: int, storage_max: int | None) -> str | None:
    """Why ``needed`` more bytes do not fit under ``dest_dir`` (None: they fit)."""
    existing = next(p for p in (dest_dir, *dest_dir.parents) if p.exists())
    free = read_drive(existing).free
    if needed > free:
        return (
            f"no room: the pull needs {format_bytes(needed)} and the drive holding "
            f"{dest_dir} has {format_bytes(free)} free; reap first (remove models you do "
            "not need) or pull to another root with --to"
        )
    if storage_max is not None:
        used = bytes_under(dest_dir) if dest_dir.exists() else 0
        if used + needed > storage_max:
            return (
                f"no room within the storage limit: the model store holds "
                f"{format_bytes(used)}, the pull needs {format_bytes(needed)} and "
                f"storage_max is {format_bytes(storage_max)}; reap first (remove models "
                "you do not need) or raise storage_max"
            )
    return None


def pull_from_box(
    spec: str,
    dest_dir: Path,
    store: Store,
    *,
    key: str | None = None,
    storage_max: int | None = None,
    events: Events | None = None,
    attempts: int = 5,
    make_room: Callable[[int], None] | None = None,
) -> list[FileOutcome]:
    """Pull the model ``spec`` names into ``dest_dir``; raises PullError (recorded too).
    ``make_room(needed)``: asked to free room when the pull does not fit (reap_to_fit)."""
    source = parse_box_spec(spec)
    puller = BoxPull(
        source,
        dest_dir,
        key=key,
        attempts=attempts,
        events=events,
        already_here=lambda sha256: same_bytes_here(store, sha256),
        no_room=lambda needed: no_room(dest_dir, needed, storage_max),
        make_room=make_room,
    )
    try:
        outcomes = puller.run()
    except PullError as exc:
        failed: list[FileOutcome | None] = list(puller.outcomes) or [None]
        for outcome in failed:
            _record(store, spec, outcome, str(exc))
        raise
    for outcome in outcomes:
        st = os.stat(outcome.path)
        kept = KeptHash(
            str(outcome.path.resolve()),
            st.st_size,
            st.st_mtime_ns,
            outcome.sha256,
            outcome.chunk_bytes,
            outcome.chunks,
            time.time(),
            None,
        )
        _keep(store, kept)
        _record(store, spec, outcome, None)
    return outcomes


def _keep(store: Store, kept: KeptHash) -> None:
    store.run(lambda conn: hashes.keep(conn, kept))


def _record(store: Store, spec: str, outcome: FileOutcome | None, error: str | None) -> None:
    if outcome is None:
        store.pulled(spec, None, None, False, "error", error)
        return
    detail = {
        "error": error,
        "fetched_bytes": outcome.fetched_bytes,
        "cuts": outcome.cuts,
        "reused_chunks": outcome.reused_chunks,
        "refetched_chunks": outcome.refetched_chunks,
    }
    outcome_word = "error" if error else "ok"
    store.pulled(
        f"{spec}/{outcome.name}",
        str(outcome.path),
        outcome.size,
        error is None,
        outcome_word,
        json.dumps(detail),
        seconds=outcome.seconds,
    )
