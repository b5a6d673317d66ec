"""Where an installation lives, and the systemd units that run it."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from fitbox.home import Home, default_home
from fitbox.installer.hardening import sandbox


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

    @property
    def socket_file(self) -> Path:
        """fitbox.socket beside fitbox.service: systemd holds the port (socket activation)."""
        return self.unit_file.with_suffix(".socket")


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
        socket=target.socket_file.name,
        gpus=True,
    )


def render_socket(host: str, port: str) -> str:
    """fitbox.socket: systemd binds the port and hands it to `fitbox serve` (LISTEN_FDS), so
    connections wait in its backlog across a stop and start of the service instead of being
    refused; the service itself re-executes on reload (SIGHUP) keeping it as well."""
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return "\n".join(
        [
            "[Unit]",
            "Description=fitbox's listening socket (connections wait here across restarts)",
            "",
            "[Socket]",
            f"ListenStream={address}",
            "Backlog=2048",  # as `fitbox serve` listens on its own socket (listening.py)
            "NoDelay=yes",
            "ReusePort=no",
            "",
            "[Install]",
            "WantedBy=sockets.target",
            "",
        ]
    )


def unit_text(
    kind: str,
    env_file: Path,
    exec_line: str,
    description: str,
    state: str,
    cache: str | None = None,
    socket: str | None = None,
    gpus: bool = False,
) -> str:
    """A service unit: restarted on failure, its children stopped with it; a system one
    runs as the fitbox user, sandboxed (hardening.py; ``gpus``: its engines may open GPU
    device nodes), with its state in /var/lib/``state``. With a
    ``socket`` unit it is handed its listening socket, and a reload sends SIGHUP (`fitbox
    serve` re-executes itself, keeping the socket and its loaded engines)."""
    lines = [
        "[Unit]",
        f"Description={description}",
        "Wants=network-online.target",
        "After=network-online.target",
        *([f"Requires={socket}", f"After={socket}"] if socket else []),
        "StartLimitIntervalSec=300",
        "StartLimitBurst=5",
        "",
        "[Service]",
        "Type=simple",
        f"EnvironmentFile={env_file}",
        f"ExecStart={exec_line}",
        *(["ExecReload=/bin/kill -HUP $MAINPID"] if socket else []),
        "Restart=on-failure",
        "RestartSec=3",
        "KillMode=control-group",  # engine children stop with the service, never linger
        "TimeoutStopSec=30",
        # systemd's default soft limit is 1,024 open files: about as many idle sockets would
        # take the box offline (fitbox also raises its soft limit to the hard one at start)
        f"LimitNOFILE={OPEN_FILES}",
    ]
    if kind == "system":
        lines += [
            "User=fitbox",
            "Group=fitbox",
            f"StateDirectory={state}",
            *([f"CacheDirectory={cache}"] if cache else []),
            "ConfigurationDirectory=fitbox",
            *sandbox(gpus),
        ]
    else:  # a user manager cannot build most of the sandbox without a user namespace
        lines += ["NoNewPrivileges=yes", "PrivateTmp=yes"]
    lines += [
        "",
        "[Install]",
        f"WantedBy={'multi-user.target' if kind == 'system' else 'default.target'}",
        "",
    ]
    return "\n".join(lines)
