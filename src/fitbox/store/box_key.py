"""The box key: an admin key made at first start, kept in a file only its owner can read."""

from __future__ import annotations

import logging
import os
import sqlite3
from pathlib import Path

from fitbox.store.db import Store
from fitbox.store.keys import create_key, find_key

log = logging.getLogger(__name__)


def write_secret(path: Path, text: str) -> None:
    """Create or replace ``path`` with mode 0600 from the first byte (no window where it is
    readable by others)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # a home made here: owner's
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    os.replace(tmp, path)


def ensure_box_key(store: Store, key_file: Path) -> None:
    """Keep a working box key in ``key_file``; make one when it is missing or revoked."""
    if key_file.is_file():
        text = key_file.read_text().strip()
        key_id = text.split("_")[1] if text.count("_") >= 2 else ""
        known = store.run(lambda conn: find_key(conn, key_id)) if key_id else None
        if known is not None and known.revoked_at is None:
            return
    _, secret = store.run(lambda conn: create_key(conn, "box key", ("admin",), is_box_key=True))
    write_secret(key_file, secret)
    log.info("box key (admin) written to %s", key_file)


def open_with_box_key(store_path: Path, key_file: Path) -> Store:
    """The store, opened, with a working box key: what a serve needs before it listens.
    Raises :class:`StoreUnavailable` (or the OSError of the key file) when the drive
    refuses; the store is closed again and nothing is moved or discarded."""
    store = Store(store_path)
    try:
        ensure_box_key(store, key_file)
    except (OSError, sqlite3.Error):
        store.close()
        raise
    return store
