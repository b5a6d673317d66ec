"""The box key: an admin key made at first start, kept in a file only its owner can read.

The file, not the store, is the key's root: a store that lost its record of it (deleted or
set aside as damaged, while the box was stopped or ran) takes the file's key back rather
than minting a new one, and says what else was lost."""

from __future__ import annotations

import logging
import os
import sqlite3
from pathlib import Path

from fitbox.store.db import Store
from fitbox.store.keys import adopt_key, create_key, find_key

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
    """Keep a working box key in ``key_file``; make one when it is missing or revoked. A
    store made while the box runs takes the file's key back at once (store/writer.py)."""
    store.on_new_file(lambda conn: _take_back(conn, key_file))
    if key_file.is_file():
        text = key_file.read_text().strip()
        key_id = text.split("_")[1] if text.count("_") >= 2 else ""
        known = store.run(lambda conn: find_key(conn, key_id)) if key_id else None
        if known is not None and known.revoked_at is None:
            return
        if known is None and store.run(lambda conn: _take_back(conn, key_file)):
            store.lost_at_start = _lost(store)
            log.error("%s", store.lost_at_start)
            return
    _, secret = store.run(lambda conn: create_key(conn, "box key", ("admin",), is_box_key=True))
    write_secret(key_file, secret)
    log.info("box key (admin) written to %s", key_file)


def _take_back(conn: sqlite3.Connection, key_file: Path) -> bool:
    """The file's key into a store with no record of it; True when it was taken back."""
    try:
        text = key_file.read_text().strip()
    except OSError:
        return False
    return adopt_key(conn, text, "box key", ("admin",)) is not None


def _lost(store: Store) -> str:
    why = (
        f"the damaged one was set aside at {store.set_aside}"
        if store.set_aside
        else "the file was deleted or moved while fitbox was stopped"
        if store.new
        else "its keys were lost"
    )
    return (
        f"the store {store.path} did not know the box key: it is a new store ({why}), so "
        "the history and every other API key made before are gone; the box key was taken "
        "back from its file and keeps working"
    )


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
