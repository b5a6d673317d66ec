"""The settings, read once: each setting of the table (fitbox.setting_table, where every one
is declared) that has an environment variable becomes a field of ``Config``.

The command line overrides the environment, which overrides the defaults. Errors name the
setting, its variable and the value: ``Setting 'ram_max' (FITBOX_RAM_MAX) has value 'lots'. ...``.
A test keeps Config's fields and the table's names the same.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fitbox.home import Home, default_home
from fitbox.networks import Network
from fitbox.setting_table import SETTINGS as SETTINGS  # re-exported: config.SETTINGS
from fitbox.setting_values import ConfigError as ConfigError  # re-exported: config.ConfigError
from fitbox.setting_values import Setting as Setting


@dataclass(frozen=True)
class Config:
    home: Path
    models: tuple[Path, ...]
    host: str
    port: int | None
    ram_max: int | None
    vram_max: int | None
    cpu_max: int | None
    storage_max: int | None
    transfer_max: int
    drive_roles: tuple[tuple[Path, str], ...]
    movers: frozenset[str]
    goal: str
    kv_types: tuple[str, ...]
    admission: str
    simulated_gpus: str
    engine_dir: str
    window: int
    parallel: int
    cpu_floor: int
    cpu_busy_percent: float
    cpu_busy_readings: int
    warmup: str
    load_timeout: float
    max_wait: float
    engine_idle_timeout: float
    reading_interval: float
    reading_retention: float
    log_retention: float
    log_max: int
    grow_cooldown: float
    stop_grace: float
    crash_limit: int
    crash_window: float
    crash_backoff: float
    trusted_networks: tuple[Network, ...]
    trusted_proxies: tuple[Network, ...]
    require_keys: bool
    max_body: int
    aliases: Path
    cors_origins: tuple[str, ...] = ()
    host_names: tuple[str, ...] = ()
    default_model: str = ""
    assist_model: str = ""
    central_url: str = ""
    central_key: str = ""
    central_db: str = ""
    central_long_poll: float = 25.0
    max_image: int = 20 << 20
    upload_max: int = 25 << 20
    artifact_max_age: float = 3600.0
    artifact_max: int = 1 << 30
    request_head_max: int = 64 << 10
    request_headers_max: int = 100
    request_head_timeout: float = 30.0
    request_body_timeout: float = 300.0
    send_stall_timeout: float = 120.0
    connections_max: int | None = None
    tf_python: str = ""
    index_url: str = "https://pypi.org/simple"
    source_key: str = ""
    admin_key: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def store_path(self) -> Path:
        return Home(self.home).store

    @property
    def facts_cache(self) -> Path:
        return Home(self.home).facts_cache

    @property
    def tf_support(self) -> Path:
        return Home(self.home).tf_support

    @property
    def box_key_file(self) -> Path:
        return Home(self.home).box_key

    @property
    def central_secret_file(self) -> Path:
        return Home(self.home).central_secret

    @property
    def spool_dir(self) -> Path:
        return Home(self.home).spool

    @property
    def artifact_dir(self) -> Path:
        return Home(self.home).artifacts

    @property
    def log_dir(self) -> Path:
        return Home(self.home).logs

    @property
    def endpoint_file(self) -> Path:
        return Home(self.home).endpoint


def load(
    overrides: Mapping[str, str | None] | None = None, env: Mapping[str, str] | None = None
) -> Config:
    """Read every setting once: ``overrides`` (the command line) > ``env`` > defaults."""
    env = os.environ if env is None else env
    overrides = overrides or {}
    values: dict[str, Any] = {}
    for setting in (s for s in SETTINGS if s.env):  # the others only the settings API sets
        raw = overrides.get(setting.name)
        if raw is None:
            raw = env.get(setting.env, setting.default)
        try:
            values[setting.name] = setting.parse(raw)
        except ValueError as exc:
            raise ConfigError(
                f"Setting '{setting.name}' ({setting.env}) has value {raw!r}. {exc}"
            ) from None
    home = Path(values["home"]).expanduser().absolute() if values["home"] else default_home()
    values["home"] = home
    values["models"] = values["models"] or (Home(home).models,)
    values["aliases"] = (
        Path(values["aliases"]).expanduser() if values["aliases"] else Home(home).aliases
    )
    if values["cors_origins"] == ("*",) and not values["require_keys"]:
        raise ConfigError(
            "Setting 'cors_origins' (FITBOX_CORS_ORIGINS) has value '*' while "
            "'require_keys' (FITBOX_REQUIRE_KEYS) is false: any web page a visitor opens could "
            "then call this box without a key from the visitor's own machine. Set "
            "FITBOX_REQUIRE_KEYS=true, or list the origins."
        )
    values["default_model"] = values["default_model"].strip()
    values["assist_model"] = values["assist_model"].strip()
    values["central_url"] = values["central_url"].strip().rstrip("/")
    if values["central_url"] and not values["central_url"].startswith(("http://", "https://")):
        raise ConfigError(
            f"Setting 'central_url' (FITBOX_CENTRAL_URL) has value "
            f"{values['central_url']!r}. Write http://HOST:PORT."
        )
    values["central_db"] = values["central_db"].strip()
    if values["central_db"] and not values["central_db"].startswith(
        ("postgresql://", "postgres://")
    ):  # its value is not shown: a mistyped URL may still hold the password
        raise ConfigError(
            "Setting 'central_db' (FITBOX_CENTRAL_DB) is not a PostgreSQL URL. "
            "Write postgresql://USER:PASSWORD@HOST:PORT/DB, or leave it unset "
            "for the SQLite file in the central's home."
        )
    return Config(**values)
