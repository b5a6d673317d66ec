"""A box's id stays with the home it was made in (server/manage/box_identity.py): the same
home keeps it across starts; a copy of the home (another path, another inode) takes a new
id and drops the original's proof of identity at the central. Real store, real files."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from fitbox.home import Home
from fitbox.server.manage.box_identity import checked_box_id
from fitbox.store.db import Store


def _start(home: Path) -> str | None:
    layout = Home(home)
    store = Store(layout.store)
    try:
        return checked_box_id(store, home, layout.identity, layout.central_secret)
    finally:
        store.close()


def test_the_same_home_keeps_its_id_and_a_copy_takes_its_own(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    home = tmp_path / "box"
    home.mkdir()
    first = _start(home)
    assert first is not None and _start(home) == first
    assert Home(home).identity.stat().st_mode & 0o777 == 0o600
    Home(home).central_secret.write_text("fbx_box_original\n")
    copy = tmp_path / "copy"
    shutil.copytree(home, copy)
    with caplog.at_level(logging.WARNING):
        other = _start(copy)
    assert other is not None and other != first
    assert f"a copy of box {first}" in caplog.text and str(copy) in caplog.text
    assert not Home(copy).central_secret.exists()  # the original's proof is not the copy's
    assert Home(home).central_secret.exists()
    assert _start(copy) == other and _start(home) == first  # each keeps its own from now on


def test_a_home_from_before_fingerprints_keeps_its_id(tmp_path: Path) -> None:
    """No identity.json yet (a box upgraded): where it starts now is taken as its home."""
    home = tmp_path / "box"
    home.mkdir()
    first = _start(home)
    Home(home).identity.unlink()
    assert _start(home) == first and Home(home).identity.is_file()
