"""Where an installation lives, and the systemd units that run it."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from fitbox.home import Home, default_home


@dataclass(frozen=True)
class ServiceLayout:
    """Where one installation's files go: the service's own (env file, unit, cache) and its
    data dir (home.py names what is inside it)."""

    kind: str  # "user" | "system"
    root: Path  # "/" normally; a scratch directory in tests and --root
    env_file: Path
    unit_file: Path
    home: Home  # FITBOX_HOME: store, box key, logs, models
    cache: Path


OPEN_FILES = 65536  # the units' open-file limit (soft and hard): sockets, engines' pipes, logs


def _under(root: Path, path: Path) -> Path:
    return root / path.relative_to(path.anchor) if root != Path("/") else path


def service_layout(kind: str, root: Path = Path("/")) -> ServiceLayout:
    if kind == "system":
        return ServiceLayout(
            kind,
            root,
            env_file=_under(root, Path("/etc/fitbox/fitbox.env")),
            unit_file=_under(root, Path("/etc/systemd/system/fitbox.service")),
            home=Home(_under(root, Path("/var/lib/fitbox"))),
            cache=_under(root, Path("/var/cache/fitbox")),
        )
    config = Path(platformdirs.user_config_dir("fitbox", appauthor=False))
    systemd = Path(os.environ.get("XDG_CONFIG_HOME", Path.home() / ".config")) / "systemd"
    return ServiceLayout(
        kind,
        root,
        env_file=_under(root, config / "fitbox.env"),
        unit_file=_under(root, systemd / "user" / "fitbox.service"),
        home=Home(_under(root, default_home())),
        cache=_under(root, Path(platformdirs.user_cache_dir("fitbox", appauthor=False))),
    )


def exec_start(python: str = sys.executable) -> str:
    return f"{python} -m fitbox serve"


def render_unit(target: ServiceLayout, python: str = sys.executable) -> str:
    """The unit for this layout. Paths inside are the installed ones (without --root)."""
    real = service_layout(target.kind) if target.root != Path("/") else target
    return unit_text(
        target.kind,
        real.env_file,
        exec_start(python),
        "fitbox: an evict-to-fit, OpenAI-compatible front door for local models",
        "fitbox",
        cache="fitbox",
    )


def unit_text(
    kind: str,
    env_file: Path,
    exec_line: str,
    description: str,
    state: str,
    cache: str | None = None,
) -> str:
    """A service unit: restarted on failure, its children stopped with it; a system one
    runs as the fitbox user, hardened, with its state in /var/lib/``state``."""
    lines = [
        "[Unit]",
        f"Description={description}",
        "Wants=network-online.target",
        "After=network-online.target",
        "StartLimitIntervalSec=300",
        "StartLimitBurst=5",
        "",
        "[Service]",
        "Type=simple",
        f"EnvironmentFile={env_file}",
        f"ExecStart={exec_line}",
        "Restart=on-failure",
        "RestartSec=3",
        "KillMode=control-group",  # engine children stop with the service, never linger
        "TimeoutStopSec=30",
        # systemd's default soft limit is 1,024 open files: about as many idle sockets would
        # take the box offline (fitbox also raises its soft limit to the hard one at start)
        f"LimitNOFILE={OPEN_FILES}",
        "NoNewPrivileges=yes",
        "PrivateTmp=yes",
    ]
    if kind == "system":
        lines += [
            "User=fitbox",
            "Group=fitbox",
            f"StateDirectory={state}",
            *([f"CacheDirectory={cache}"] if cache else []),
            "ConfigurationDirectory=fitbox",
            "UMask=0027",
            "ProtectSystem=strict",
            "ProtectHome=read-only",
            "ProtectKernelTunables=yes",
            "ProtectControlGroups=yes",
            "RestrictSUIDSGID=yes",
            "LockPersonality=yes",
        ]
    lines += [
        "",
        "[Install]",
        f"WantedBy={'multi-user.target' if kind == 'system' else 'default.target'}",
        "",
    ]
    return "\n".join(lines)
