"""Drives with roles, and which worker copies leave so a pull or an upload fits.

- ``central``: the source of record; never reaped.
- ``worker``: the fast drive loads read from, kept within its storage budget.
- ``immutable``: read in place, never written, never reaped.

``reap_to_fit`` removes the least recently called worker copies whose exact twin (the same
sha256) is on a central drive, until ``need`` bytes fit on the worker drive; never a
resident's, a serving model's or a pinned model's copy, and never a last copy (one with no
central twin). Every copy it keeps says why. Pure: same drives and copies, same plan.

A split GGUF (``NAME-00001-of-0000N.gguf`` …) is one copy of all its shards: removed whole
or kept whole, and only when every shard's exact twin is on a central drive; a set missing
a shard (no model as it stands) is never reaped in part.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from fitbox.core.shard_names import shard_of


class DriveRole(Enum):
    CENTRAL = "central"
    WORKER = "worker"
    IMMUTABLE = "immutable"


@dataclass(frozen=True)
class Drive:
    id: str
    role: DriveRole
    free: int  # bytes the filesystem has free
    used: int = 0  # bytes model copies hold on it
    budget: int | None = None  # bytes copies may hold on it (a worker's storage budget)

    def room(self) -> int:
        room = self.free
        if self.budget is not None:
            room = min(room, self.budget - self.used)
        return max(0, room)


@dataclass(frozen=True)
class Shard:
    """One file of a split GGUF copy."""

    path: str
    bytes: int
    sha256: str | None  # None: never hashed


@dataclass(frozen=True)
class Copy:
    path: str  # the file; of a split GGUF, its first shard (the name the model goes by)
    drive: str
    bytes: int  # every file of it
    sha256: str | None  # None: never hashed, so no twin can be proven (a set: its first shard)
    last_called: float = 0.0  # when a call last used it (0: never)
    resident: bool = False
    serving: bool = False
    pinned: bool = False
    shards: tuple[Shard, ...] = ()  # a split GGUF's files, the first included; () for one file
    complete: bool = True  # a split GGUF with every shard its name counts

    @property
    def files(self) -> tuple[str, ...]:
        """Every path it holds, the first (the one a load names) first."""
        return tuple(s.path for s in self.shards) if self.shards else (self.path,)

    @property
    def hashes(self) -> tuple[str | None, ...]:
        """The sha256 of each of its files."""
        return tuple(s.sha256 for s in self.shards) if self.shards else (self.sha256,)


@dataclass(frozen=True)
class StoredFile:
    """One GGUF file stored on a drive, as the movers find it."""

    path: str
    drive: str
    bytes: int
    sha256: str | None


def copies_of(files: Sequence[StoredFile], last_called: Mapping[str, float]) -> list[Copy]:
    """The files as copies: a single GGUF is one, the shards of a split GGUF in one directory
    of one drive are one together (named by shard 1, marked incomplete when its count says
    there are more); ``last_called`` by the path a call names (a set's first shard)."""
    singles: list[Copy] = []
    sets: dict[tuple[str, str, str, int], list[tuple[int, StoredFile]]] = {}
    for f in files:
        found = shard_of(posixpath.basename(f.path))
        if found is None:
            singles.append(Copy(f.path, f.drive, f.bytes, f.sha256, last_called.get(f.path, 0.0)))
            continue
        key = (f.drive, posixpath.dirname(f.path), found.base, found.count)
        sets.setdefault(key, []).append((found.index, f))
    for (drive, _, _, count), members in sets.items():
        members.sort(key=lambda pair: pair[0])
        shards = tuple(Shard(f.path, f.bytes, f.sha256) for _, f in members)
        complete = [index for index, _ in members] == list(range(1, count + 1))
        called = max(last_called.get(s.path, 0.0) for s in shards)
        singles.append(
            Copy(
                shards[0].path,
                drive,
                sum(s.bytes for s in shards),
                shards[0].sha256,
                called,
                shards=shards,
                complete=complete,
            )
        )
    return sorted(singles, key=lambda c: (c.drive, c.path))


class Kept(Enum):
    NOT_ON_WORKER = "not on the worker drive (central and immutable copies are never reaped)"
    RESIDENT = "its model is resident"
    SERVING = "its model is serving a call"
    PINNED = "its model is pinned"
    INCOMPLETE_SET = "a split GGUF missing shards: never reaped in part"
    UNHASHED = "never hashed: no twin can be proven"
    LAST_COPY = "no exact twin (same sha256) on a central drive: the last copy"
    NOT_NEEDED = "enough room was freed without it"


@dataclass(frozen=True)
class ReapPlan:
    victims: tuple[Copy, ...]
    kept: tuple[tuple[Copy, Kept], ...]
    freed: int
    short_by: int  # bytes still missing after every victim (0: it fits)


def _why_kept(copy: Copy, drive: Drive, central_hashes: frozenset[str]) -> Kept | None:
    if copy.drive != drive.id or drive.role is not DriveRole.WORKER:
        return Kept.NOT_ON_WORKER
    if copy.serving:
        return Kept.SERVING
    if copy.resident:
        return Kept.RESIDENT
    if copy.pinned:
        return Kept.PINNED
    if not copy.complete:
        return Kept.INCOMPLETE_SET
    if None in copy.hashes:
        return Kept.UNHASHED
    if not all(sha256 in central_hashes for sha256 in copy.hashes):
        return Kept.LAST_COPY  # of a set: a shard with no twin would be lost with it
    return None


def reap_to_fit(
    drives: Sequence[Drive], copies: Sequence[Copy], drive_id: str, need: int
) -> ReapPlan:
    """The copies to remove from ``drive_id`` so ``need`` more bytes fit there."""
    by_id = {d.id: d for d in drives}
    drive = by_id[drive_id]
    centrals = {d.id for d in drives if d.role is DriveRole.CENTRAL}
    central_hashes = frozenset(
        sha256 for c in copies if c.drive in centrals for sha256 in c.hashes if sha256 is not None
    )
    short = need - drive.room()
    victims: list[Copy] = []
    kept: list[tuple[Copy, Kept]] = []
    candidates = []
    for copy in sorted(copies, key=lambda c: (c.last_called, c.path)):
        why = _why_kept(copy, drive, central_hashes)
        if why is None:
            candidates.append(copy)
        elif copy.drive == drive.id:
            kept.append((copy, why))
    freed = 0
    for copy in candidates:
        if freed >= short:
            kept.append((copy, Kept.NOT_NEEDED))
            continue
        victims.append(copy)
        freed += copy.bytes
    return ReapPlan(tuple(victims), tuple(kept), freed, max(0, short - freed))
