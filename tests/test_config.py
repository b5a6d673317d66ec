from __future__ import annotations

import dataclasses
import os
import re
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


REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "docs" / "reference" / "settings.md"


def test_the_settings_reference_is_what_the_generator_writes() -> None:
    """docs/reference/settings.md is written by ``fitbox settings --markdown``; a setting added,
    renamed or re-documented without writing it again fails here."""
    from fitbox.cli import parser
    from fitbox.cli.settings import reference

    written = REFERENCE.read_text()
    rows = {line.split("|")[1].strip(" `") for line in written.splitlines() if "| `" in line}
    missing = sorted({s.name for s in config.SETTINGS} - rows)
    assert not missing, f"not in {REFERENCE.name}: {missing}; run fitbox settings --markdown"
    assert written == reference(parser()), (
        f"{REFERENCE.name} is stale: run fitbox settings --markdown"
    )


def test_every_environment_variable_fitbox_reads_is_a_setting() -> None:
    """So every one is in the reference: a FITBOX_ name in src/ that the table lacks fails
    (but those fitbox sets for the tools it points at a box, harness/tools.py HANDED_ENV)."""
    from fitbox.harness.shapes import HANDED_ENV

    named = set()
    for path in (REPO / "src" / "fitbox").rglob("*.py"):
        named |= set(re.findall(r"FITBOX_[A-Z][A-Z_]*[A-Z]", path.read_text()))
    declared = {s.env for s in config.SETTINGS if s.env} | set(HANDED_ENV)
    # what `fitbox serve` hands itself across a re-exec (cli/serve.py), never set by a person
    handed = {"FITBOX_LISTEN_FD", "FITBOX_HANDED_PIPES"}
    assert named and not named - declared - handed, sorted(named - declared - handed)


def test_config_has_one_field_per_setting_read_at_start_under_the_same_name() -> None:
    fields = {f.name for f in dataclasses.fields(config.Config)} - {"extra"}
    assert fields == {s.name for s in config.SETTINGS if s.env}


def test_the_settings_api_knobs_are_the_tables_names_with_its_defaults(tmp_path: Path) -> None:
    from fitbox.box.preferences import BOX_KNOBS, KEY_KNOBS, LIMIT_KNOBS, PAIR_KNOBS, Preferences

    cfg = config.load(env={"FITBOX_HOME": str(tmp_path), "FITBOX_CTX": "2048"})
    names = {s.name for s in config.SETTINGS}
    assert set(BOX_KNOBS) | set(PAIR_KNOBS) | set(KEY_KNOBS) | set(LIMIT_KNOBS) <= names
    defaults = Preferences(cfg).defaults()
    assert set(defaults) == set(BOX_KNOBS) | set(PAIR_KNOBS) | set(KEY_KNOBS)
    assert defaults["window"] == cfg.window == 2048  # FITBOX_CTX sets the window knob
    assert defaults["max_wait"] == cfg.max_wait == 300.0 and defaults["quant"] is None


def test_a_settings_flag_comes_from_the_table_and_wins_over_the_environment(
    tmp_path: Path,
) -> None:
    from fitbox.cli import parser
    from fitbox.cli.command import overrides

    args = parser().parse_args(["serve", "--port", "9001", "--central", "http://c:1"])
    cfg = config.load(overrides(args), env={"FITBOX_HOME": str(tmp_path), "FITBOX_PORT": "9"})
    assert cfg.port == 9001 and cfg.central_url == "http://c:1"
    install = parser().parse_args(["install", "--central", "http://c:1"])
    assert overrides(install)["central_url"] is None  # the service's, not this process's
