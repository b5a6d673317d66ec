"""A box's id stays with the box, not with a copy of its home. A home copied to another
machine or folder (a cloned VM, a restored backup beside the original, a ``cp -a``) carries
the same id, and a central would take the copy for the original moved. So the box keeps,
beside its id, where that id was made: the machine (``/etc/machine-id``), the home's path
and its inode. A start that finds its id somewhere else makes a new id (and drops the
proof of the old one, central.secret), says why in its log, and joins as a box of its own;
the history the copy brought is its own from then on."""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any

from fitbox.store.box_key import write_secret
from fitbox.store.db import Store

log = logging.getLogger(__name__)
MACHINE_ID_FILES = (Path("/etc/machine-id"), Path("/var/lib/dbus/machine-id"))


def machine_id() -> str:
    for path in MACHINE_ID_FILES:
        try:
            found = path.read_text().strip()
        except OSError:
            continue
        if found:
            return found
    return ""


def fingerprint(home: Path) -> dict[str, Any]:
    """Where this home is now: the machine, its path, its inode (a copy gets another)."""
    resolved = home.resolve()
    return {"machine_id": machine_id(), "home": str(resolved), "inode": resolved.stat().st_ino}


def checked_box_id(store: Store, home: Path, identity_file: Path, secret_file: Path) -> str | None:
    """The box's id, made anew when the home it was made in is not this one."""
    box_id = store.box_id()
    if box_id is None:
        return None
    here = fingerprint(home)
    try:
        kept = json.loads(identity_file.read_text())
    except (OSError, ValueError):
        kept = None  # the first start (or one before ids were fingerprinted): this is home
    if isinstance(kept, dict) and kept.get("box_id") == box_id:
        moved = [k for k, v in here.items() if kept.get(k) != v]
        if moved:
            box_id = _new_id(store, box_id, moved, kept, here, secret_file)
    try:
        write_secret(identity_file, json.dumps({"box_id": box_id, **here}))
    except OSError as exc:
        log.warning("where this box's id was made cannot be kept in %s: %s", identity_file, exc)
    return box_id


def _new_id(
    store: Store,
    old: str,
    moved: list[str],
    kept: dict[str, Any],
    here: dict[str, Any],
    secret_file: Path,
) -> str:
    new = str(uuid.uuid4())
    store.run(
        lambda conn: conn.execute(
            "UPDATE box_identity SET box_id = ?, created_at = ?", (new, time.time())
        )
    )
    with_reason = ", ".join(f"{k} {kept.get(k)!r} -> {here[k]!r}" for k in moved)
    log.warning(
        "this home is a copy of box %s's (%s): it is box %s from now on, so the two are never "
        "taken for one at a central",
        old,
        with_reason,
        new,
    )
    if secret_file.exists():
        os.remove(secret_file)  # the original's proof: this box gets its own at its first join
    return new
