"""The command-line edge of the installer: validate, confirm, carry out, report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fitbox.config import Config
from fitbox.installer.install import (
    InstallError,
    carry_out,
    main_install,
    plan_install,
    plan_uninstall,
    read_env,
    systemd_running,
)
from fitbox.installer.units import layout
from fitbox.installer.update import UpdateError, update
from fitbox.probe.host import read_host
from fitbox.units import format_bytes, parse_size


def _env_pairs(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise InstallError(f"--env {pair!r}: write it as KEY=VALUE")
        env[name] = value
    return env


def run(args: argparse.Namespace) -> int:
    target = layout(args.kind or "user", Path(args.root))
    try:
        if args.command == "uninstall":
            carry_out(plan_uninstall(target, args.purge), args.dry_run)
            return 0
        extra = _env_pairs(args.env)
        if args.ram_max:
            wanted, total = parse_size(args.ram_max), read_host().mem_total
            if wanted > total:
                raise InstallError(f"--ram-max {args.ram_max} is above this box's RAM "
                                   f"({format_bytes(total)})")  # fmt: skip
            extra["FITBOX_RAM_MAX"] = str(wanted)
        if not (args.yes or args.dry_run) and sys.stdin.isatty():
            plan = plan_install(target, host=args.host, port=args.port, extra_env=extra)
            carry_out(plan, dry_run=True)
            if input("Proceed? [y/N] ").strip().lower() not in ("y", "yes"):
                return 1
        return main_install(target, args.host, args.port, extra, args.dry_run,
                            args.health_timeout)  # fmt: skip
    except (InstallError, ValueError, OSError) as exc:
        print(f"fitbox {args.command}: {exc}", file=sys.stderr)
        return 1


def run_update(config: Config, args: argparse.Namespace) -> int:
    """Restart the installed service when there is one (user first, then system); else the
    new version is checked on a scratch port (installer/update.py)."""
    restart = url = None
    if systemd_running():
        for kind, scope in (("user", ["--user"]), ("system", [])):
            target = layout(kind)
            if target.unit_file.is_file():
                env = read_env(target.env_file)
                restart = ["systemctl", *scope, "restart", "fitbox.service"]
                url = f"http://{env.get('FITBOX_HOST', '127.0.0.1')}:{env.get('FITBOX_PORT')}"
                break
    try:
        said = update(args.index_url, args.apply, args.wanted, config.home,
                      args.health_timeout, restart, url)  # fmt: skip
    except UpdateError as exc:
        print(f"fitbox update: {exc}", file=sys.stderr)
        return 1
    print(said)
    return 0
