from __future__ import annotations

import os
from pathlib import Path

import pytest

from fitbox import config
from fitbox.installer.units import service_layout


def test_defaults_put_everything_under_the_home(tmp_path: Path) -> None:
    cfg = config.load(env={"FITBOX_HOME": str(tmp_path)})
    assert cfg.home == tmp_path
    assert cfg.models == (tmp_path / "models",)
    assert cfg.store_path.parent == tmp_path
    assert cfg.port == 8484 and cfg.ram_max is None


def test_serve_finds_what_a_user_install_made(tmp_path: Path) -> None:
    installed = service_layout("user")
    served = config.load(env={})  # the service's env file sets FITBOX_HOME; a shell may not
    assert served.home == installed.home.path
    assert served.store_path == installed.home.store
    assert served.box_key_file == installed.home.box_key
    assert served.models == (installed.home.models,)
    in_a_root = service_layout("system", tmp_path).home
    assert in_a_root.box_key.relative_to(tmp_path) == Path("var/lib/fitbox/box.key")


def test_models_env_is_pathsep_separated_and_the_command_line_wins(tmp_path: Path) -> None:
    env = {"FITBOX_HOME": str(tmp_path), "FITBOX_MODELS": f"/a{os.pathsep}/b"}
    assert config.load(env=env).models == (Path("/a"), Path("/b"))
    assert config.load({"models": "/c"}, env=env).models == (Path("/c"),)


def test_port_auto_and_sizes(tmp_path: Path) -> None:
    cfg = config.load({"port": "auto", "ram_max": "2GiB"}, env={"FITBOX_HOME": str(tmp_path)})
    assert cfg.port is None and cfg.ram_max == 2 << 30


def test_errors_name_the_setting_and_the_value(tmp_path: Path) -> None:
    with pytest.raises(config.ConfigError, match=r"'ram_max' \(FITBOX_RAM_MAX\) has value 'lots'"):
        config.load(env={"FITBOX_HOME": str(tmp_path), "FITBOX_RAM_MAX": "lots"})
    with pytest.raises(config.ConfigError, match="'port'"):
        config.load({"port": "99999"}, env={"FITBOX_HOME": str(tmp_path)})
