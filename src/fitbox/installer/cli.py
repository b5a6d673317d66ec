"""The command-line edge of the installer: validate, confirm, carry out, report."""

from __future__ import annotations

import argparse
import os
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
from fitbox.installer.units import ServiceLayout, service_layout
from fitbox.installer.update import UpdateError, update
from fitbox.units import parse_size


def _env_pairs(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise InstallError(f"--env {pair!r}: write it as KEY=VALUE")
        env[name] = value
    return env


def _limits(args: argparse.Namespace, target: ServiceLayout) -> dict[str, str]:
    """--ram-max/--vram-max/--cpu-max/--storage-max as settings; one above what this box has
    is refused with the reason (core/tiers.py)."""
    from fitbox.box.limits import problems_on_this_box
    from fitbox.probe.gpus import open_gpu_probe

    given = {
        "ram_max": args.ram_max,
        "vram_max": args.vram_max,
        "cpu_max": args.cpu_max,
        "storage_max": args.storage_max,
    }
    values: dict[str, int] = {}
    for name, raw in given.items():
        if raw:
            values[name] = int(raw) if name == "cpu_max" else parse_size(raw)
    if not values:
        return {}
    gpus = open_gpu_probe(os.environ.get("FITBOX_SIMULATED_GPUS", "")).read()
    if "vram_max" in values and not gpus:
        raise InstallError("--vram-max: this box has no GPU")
    home = target.home
    roots = [home.models, home.path, *home.path.parents]  # the first that exists
    refused = problems_on_this_box(values.get, gpus, roots)
    if refused:
        raise InstallError("; ".join(refused))
    return {f"FITBOX_{name.upper()}": str(value) for name, value in values.items()}


def check_central(central: str) -> str:
    """Whether the central answers. The service registers itself there at every start (with
    its persistent box id, server/manage/joining.py), so the install only checks and says so; a
    central that cannot be reached never fails the install: the box serves on its own."""
    import httpx

    try:
        response = httpx.get(f"{central.rstrip('/')}/health", timeout=10)
        service = response.json().get("service") if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        return f"note: the central at {central} could not be reached ({exc}); installed anyway"
    if service != "fitbox-central":
        return (
            f"note: {central} does not answer as a fitbox central (HTTP "
            f"{response.status_code}); installed anyway"
        )
    return (
        f"the central at {central} answers; the service registers with it at every "
        "start (see its log for the outcome)"
    )


def run(args: argparse.Namespace) -> int:
    if not sys.platform.startswith("linux") and Path(args.root) == Path("/"):
        print(
            f"fitbox {args.command}: installing a service needs Linux with systemd; this is "
            f"{sys.platform}. Run fitbox in the foreground instead: fitbox serve --port 8484",
            file=sys.stderr,
        )
        return 1
    if getattr(args, "central_role", False):
        return _run_central(args)
    target = service_layout(args.kind or "user", Path(args.root))
    try:
        if args.command == "uninstall":
            carry_out(plan_uninstall(target, args.purge), args.dry_run)
            return 0
        extra = _env_pairs(args.env) | _limits(args, target)
        if args.central:
            extra["FITBOX_CENTRAL_URL"] = args.central
            if args.central_key:
                extra["FITBOX_CENTRAL_KEY"] = args.central_key  # the env file is 0600
        if not (args.yes or args.dry_run) and sys.stdin.isatty():
            plan = plan_install(target, host=args.host, port=args.port, extra_env=extra)
            carry_out(plan, dry_run=True)
            if input("Proceed? [y/N] ").strip().lower() not in ("y", "yes"):
                return 1
        code = main_install(target, args.host, args.port, extra, args.dry_run, args.health_timeout)
        if args.central and not args.dry_run:
            print(check_central(args.central))
        return code
    except (InstallError, ValueError, OSError) as exc:
        print(f"fitbox {args.command}: {exc}", file=sys.stderr)
        return 1


def _run_central(args: argparse.Namespace) -> int:
    """install|uninstall --central-role: the central's service (installer/central_role.py)."""
    from fitbox.installer.central_role import (
        central_layout,
        install_central,
        plan_central_uninstall,
    )

    target = central_layout(args.kind or "user", Path(args.root))
    try:
        if args.command == "uninstall":
            carry_out(plan_central_uninstall(target, args.purge), args.dry_run)
            return 0
        box_only = [
            flag
            for flag, given in (
                ("--central", args.central),
                ("--central-key", args.central_key),
                ("--ram-max", args.ram_max),
                ("--vram-max", args.vram_max),
                ("--cpu-max", args.cpu_max),
                ("--storage-max", args.storage_max),
            )
            if given
        ]
        if box_only:
            raise InstallError(
                f"{', '.join(box_only)}: a box's setting, not the central's "
                "(install the box apart: fitbox install --central URL)"
            )
        return install_central(
            target, args.host, args.port, _env_pairs(args.env), args.dry_run, args.health_timeout
        )
    except (InstallError, ValueError, OSError) as exc:
        print(f"fitbox {args.command}: {exc}", file=sys.stderr)
        return 1


def run_update(config: Config, args: argparse.Namespace) -> int:
    """Restart the installed service when there is one (user first, then system); else the
    new version is checked on a scratch port (installer/update.py)."""
    restart = url = None
    if systemd_running():
        for kind, scope in (("user", ["--user"]), ("system", [])):
            target = service_layout(kind)
            if target.unit_file.is_file():
                env = read_env(target.env_file)
                restart = ["systemctl", *scope, "restart", "fitbox.service"]
                url = f"http://{env.get('FITBOX_HOST', '127.0.0.1')}:{env.get('FITBOX_PORT')}"
                break
    try:
        said = update(
            args.index_url, args.apply, args.wanted, config.home, args.health_timeout, restart, url
        )
    except UpdateError as exc:
        print(f"fitbox update: {exc}", file=sys.stderr)
        return 1
    print(said)
    return 0
