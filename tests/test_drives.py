"""Drive roles: declared by the drive_roles setting, else inferred from the model roots."""

from __future__ import annotations

from pathlib import Path

import pytest

from fitbox import config
from fitbox.box.drives import role_of
from fitbox.core.reap import DriveRole


def test_declared_roles_win_and_the_longest_directory_decides(tmp_path: Path) -> None:
    fast, slow = tmp_path / "nvme" / "models", tmp_path / "hdd" / "models"
    fast.mkdir(parents=True)
    slow.mkdir(parents=True)
    roles = f"{tmp_path}=central,{tmp_path / 'nvme'}=worker"
    declared = config.load({}, env={"FITBOX_DRIVE_ROLES": roles}).drive_roles
    assert role_of(fast, [slow, fast], declared)[0] is DriveRole.WORKER
    role, why = role_of(slow, [slow, fast], declared)
    assert role is DriveRole.CENTRAL and why == f"drive_roles: {tmp_path}=central"


def test_roles_are_inferred_when_not_declared(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    assert role_of(first, [first, second], ())[0] is DriveRole.WORKER
    assert role_of(second, [first, second], ())[0] is DriveRole.CENTRAL
    assert role_of(tmp_path / "gone", [first], ())[0] is DriveRole.IMMUTABLE


def test_a_bad_role_names_the_setting() -> None:
    with pytest.raises(config.ConfigError, match="FITBOX_DRIVE_ROLES"):
        config.load({}, env={"FITBOX_DRIVE_ROLES": "/srv=fast"})
