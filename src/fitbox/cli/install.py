"""``fitbox install | uninstall | update``, the command-line edge of the installer: validate,
confirm, carry out, report. The installer is imported when one of them runs, not when any
command parses."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from fitbox.cli.command import add_setting_flags
from fitbox.config import Config
from fitbox.units import parse_size

if TYPE_CHECKING:
    from fitbox.installer.units import ServiceLayout

INSTALL_HELP = "install fitbox as a systemd service"
UNINSTALL_HELP = "remove the service (--purge: state too)"
UPDATE_HELP = "compare with the newest release; --apply installs it"


def _add_shared_arguments(parser: argparse.ArgumentParser) -> None:
    """What install and uninstall share: where and how they act."""
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument("--user", dest="kind", action="store_const", const="user")
    kind.add_argument("--system", dest="kind", action="store_const", const="system")
    parser.add_argument("--dry-run", action="store_true", help="print every step, change nothing")
    parser.add_argument(
        "--root", default="/", help="install into this directory tree (for images and tests)"
    )
    parser.add_argument("--yes", action="store_true", help="do not ask")
    parser.add_argument(
        "--central-role",
        action="store_true",
        help="the central (fitbox-central.service), not a box",
    )


def add_install_arguments(install: argparse.ArgumentParser) -> None:
    _add_shared_arguments(install)
    install.add_argument("--port", help="N, or auto for a free one (kept on re-runs)")
    install.add_argument("--host", help="address to listen on (default 127.0.0.1, kept)")
    install.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    install.add_argument("--ram-max", help="cap on host RAM for models, e.g. 8GiB")
    install.add_argument("--vram-max", help="cap on each GPU's memory for models, e.g. 20GiB")
    install.add_argument("--cpu-max", help="cap on the physical cores engines may claim")
    install.add_argument("--storage-max", help="cap on the model store's drive, e.g. 500GiB")
    install.add_argument("--central", metavar="URL", help="register with a fitbox central")
    install.add_argument("--central-key", metavar="KEY", help="the key the central gave")
    install.add_argument("--health-timeout", type=float, default=180.0)
    install.add_argument(
        "--tf",
        action="store_true",
        help="only build the transformers engine's venv (<engine dir>/tf: "
        "FITBOX_ENGINE_DIR, else <home>/engines)",
    )
    install.add_argument(
        "--tasks",
        nargs="?",
        const="all",
        metavar="RUNNER",
        help="only build the task runners' environments (<engine dir>/<runner>), every one "
        "or the one named (faster-whisper, piper); one that failed is built again",
    )


def add_uninstall_arguments(uninstall: argparse.ArgumentParser) -> None:
    _add_shared_arguments(uninstall)
    uninstall.add_argument(
        "--purge", action="store_true", help="also state and cache (the model store is always kept)"
    )


def add_update_arguments(update: argparse.ArgumentParser) -> None:
    update.add_argument("--apply", action="store_true", help="install it (rolls back on failure)")
    update.add_argument("--version", dest="wanted", help="this release instead of the newest")
    add_setting_flags(update, "index_url")
    update.add_argument("--health-timeout", type=float, default=180.0)


def _env_pairs(pairs: list[str]) -> dict[str, str]:
    from fitbox.installer.install import InstallError

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
    from fitbox.installer.install import InstallError
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


def run(config: Config, args: argparse.Namespace) -> int:
    """install or uninstall: the box's service, its central's (--central-role), or only the
    transformers engine's venv (install --tf)."""
    if getattr(args, "tf", False) or getattr(args, "tasks", None):
        from fitbox.engines.kinds import engines_home

        where = engines_home(config.engine_dir, config.home)
        assert where is not None  # a config always has a home
        if getattr(args, "tasks", None):
            from fitbox.installer.task_engines import install_tasks

            return install_tasks(where, args.tasks)
        from fitbox.installer.tf_engine import install_tf

        return install_tf(where, config.tf_support)
    return _run_service(args)


def _run_service(args: argparse.Namespace) -> int:
    from fitbox.installer.install import (
        InstallError,
        carry_out,
        main_install,
        plan_install,
        plan_uninstall,
    )
    from fitbox.installer.units import service_layout

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
    from fitbox.installer.install import InstallError, carry_out

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
    """Reload (SIGHUP) or restart the installed service when there is one (user first,
    then system); else the new version is checked on a scratch port (installer/update.py)."""
    from fitbox.installer.install import read_env, systemd_running
    from fitbox.installer.units import service_layout
    from fitbox.installer.update import UpdateError, update

    restart = url = None
    if systemd_running():
        for kind, scope in (("user", ["--user"]), ("system", [])):
            target = service_layout(kind)
            if target.unit_file.is_file():
                env = read_env(target.env_file)
                # a unit with ExecReload re-executes in place (SIGHUP: socket and models
                # kept, cli/serve.py); an older unit without one is restarted
                restart = ["systemctl", *scope, "reload-or-restart", "fitbox.service"]
                url = f"http://{env.get('FITBOX_HOST', '127.0.0.1')}:{env.get('FITBOX_PORT')}"
                break
    try:
        said = update(
            config.index_url,
            args.apply,
            args.wanted,
            config.home,
            args.health_timeout,
            restart,
            url,
        )
    except UpdateError as exc:
        print(f"fitbox update: {exc}", file=sys.stderr)
        return 1
    print(said)
    return 0
