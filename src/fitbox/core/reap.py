"""Drives with roles, and which worker copies leave so a pull or an upload fits.

- ``central``: the source of record; never reaped.
- ``worker``: the fast drive loads read from, kept within its storage budget.
- ``immutable``: read in place, never written, never reaped.

``reap_to_fit`` removes the least recently called worker copies whose exact twin (the same
sha256) is on a central drive, until ``need`` bytes fit on the worker drive; never a
resident's, a serving model's or a pinned model's copy, and never a last copy (one with no
central twin). Every copy it keeps says why. Pure: same drives and copies, same plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum


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
class Copy:
    path: str
    drive: str
    bytes: int
    sha256: str | None  # None: never hashed, so no twin can be proven
    last_called: float = 0.0  # when a call last used it (0: never)
    resident: bool = False
    serving: bool = False
    pinned: bool = False


class Kept(Enum):
    NOT_ON_WORKER = "not on the worker drive (central and immutable copies are never reaped)"
    RESIDENT = "its model is resident"
    SERVING = "its model is serving a call"
    PINNED = "its model is pinned"
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
    if copy.sha256 is None:
        return Kept.UNHASHED
    if copy.sha256 not in central_hashes:
        return Kept.LAST_COPY
    return None


def reap_to_fit(drives: Sequence[Drive], copies: Sequence[Copy], drive_id: str,
                need: int) -> ReapPlan:  # fmt: skip
    """The copies to remove from ``drive_id`` so ``need`` more bytes fit there."""
    by_id = {d.id: d for d in drives}
    drive = by_id[drive_id]
    centrals = {d.id for d in drives if d.role is DriveRole.CENTRAL}
    central_hashes = frozenset(c.sha256 for c in copies
                               if c.sha256 is not None and c.drive in centrals)  # fmt: skip
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
