"""The role of each model root's drive (core/reap.py's DriveRole): from the drive_roles
setting (the longest directory that holds the root), else inferred: a drive fitbox cannot
write is immutable, the first model root's is the worker, any other's is central."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from fitbox.core.reap import DriveRole


def role_of(
    root: Path, roots: Sequence[Path], declared: Sequence[tuple[Path, str]]
) -> tuple[DriveRole, str]:
    """(role, why) for the model root ``root``, one of ``roots``."""
    real = root.resolve()
    holding = [(p.resolve(), r) for p, r in declared if real.is_relative_to(p.resolve())]
    if holding:
        where, role = max(holding, key=lambda pair: len(pair[0].parts))
        return DriveRole(role), f"drive_roles: {where}={role}"
    if not _writable(root):
        return DriveRole.IMMUTABLE, "inferred: fitbox cannot write there"
    if roots and root == roots[0]:
        return DriveRole.WORKER, "inferred: the first model root (pulls land there)"
    return DriveRole.CENTRAL, "inferred: a model root after the first"


def _writable(root: Path) -> bool:
    try:
        read_only = bool(os.statvfs(root).f_flag & os.ST_RDONLY)
    except OSError:
        return False
    return not read_only and os.access(root, os.W_OK)
