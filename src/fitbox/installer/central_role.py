"""``fitbox install --central-role``: the central as a service (``fitbox-central.service``),
next to a box on the same host or on a host of its own. Its own env file, unit and data dir,
never a box's: a box and a central on one host share nothing but the program. The same
rules as a box's install: every step safe to repeat (a re-run keeps host and port), the env
file owner-only, ``--root`` renders the files into a scratch tree, ``--dry-run`` changes
nothing. Keys are not made here: ``fitbox central keys create`` prints one once."""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import platformdirs

from fitbox.home import CentralHome, default_home, make_private
from fitbox.installer.install import (
    Plan,
    Step,
    carry_out,
    read_env,
    refuse_unreachable,
    render_env,
    service_env,
    start_or_say_how,
    system_user,
    systemd_running,
    wait_for_health,
)
from fitbox.installer.units import _under, unit_text
from fitbox.store.box_key import write_secret

UNIT = "fitbox-central.service"


@dataclass(frozen=True)
class CentralLayout:
    kind: str  # "user" | "system"
    root: Path
    env_file: Path
    unit_file: Path
    home: CentralHome


def central_layout(kind: str, root: Path = Path("/")) -> CentralLayout:
    if kind == "system":
        return CentralLayout(
            kind,
            root,
            _under(root, Path("/etc/fitbox/fitbox-central.env")),
            _under(root, Path(f"/etc/systemd/system/{UNIT}")),
            CentralHome(_under(root, Path("/var/lib/fitbox-central"))),
        )
    config = Path(platformdirs.user_config_dir("fitbox", appauthor=False))
    systemd = Path(os.environ.get("XDG_CONFIG_HOME", Path.home() / ".config")) / "systemd"
    # the folder `fitbox central serve` uses when FITBOX_HOME is not set (central/cli.py)
    return CentralLayout(
        kind,
        root,
        _under(root, config / "fitbox-central.env"),
        _under(root, systemd / "user" / UNIT),
        CentralHome(_under(root, default_home() / "central")),
    )


def render_central_unit(target: CentralLayout, python: str = sys.executable) -> str:
    """The unit, with the installed paths inside (without --root)."""
    real = central_layout(target.kind) if target.root != Path("/") else target
    return unit_text(
        target.kind,
        real.env_file,
        f"{python} -m fitbox central serve",
        "fitbox central: many fitbox boxes behind one address",
        "fitbox-central",
    )


def _migrate(target: CentralLayout) -> None:
    from fitbox.central.store import CentralStore

    CentralStore(target.home.store).close()


def _hand_over(target: CentralLayout) -> None:
    for path in (target.home.path, *target.home.path.rglob("*")):
        shutil.chown(path, "fitbox", "fitbox")
        if path.is_file():
            path.chmod(0o600)  # the store holds each box's admin key
    target.home.path.chmod(0o700)


def plan_central_install(
    target: CentralLayout, *, host: str | None, port: str | None, extra_env: dict[str, str]
) -> Plan:
    refuse_unreachable(target.kind, target.root)
    # a free port, not the box's usual one: a box installed beside it takes that one
    env = service_env(
        target.env_file, target.home.path, target.root, host, port, extra_env, usual_port=None
    )
    plan = Plan(target, env)
    plan.steps += [
        Step(
            f"create {target.home.path} (owner-only; kept if it exists)",
            partial(make_private, target.home.path),
        ),
        *(
            Step(f"create {d}", partial(d.mkdir, parents=True, exist_ok=True))
            for d in (target.env_file.parent, target.unit_file.parent)
        ),
        Step(
            f"write {target.env_file} (mode 0600)",
            lambda: write_secret(target.env_file, render_env(env).rstrip("\n")),
        ),
        Step(
            f"write {target.unit_file}",
            lambda: target.unit_file.write_text(render_central_unit(target)),
        ),
        Step(
            f"make the central's store {target.home.store} (migrated; kept if it exists)",
            lambda: _migrate(target),
        ),
    ]
    if target.kind == "system" and target.root == Path("/"):
        plan.steps.insert(0, Step("create the system user and group 'fitbox'", system_user))
        plan.steps.append(
            Step(
                f"give {target.home.path} to fitbox:fitbox (owner-only)", lambda: _hand_over(target)
            )
        )
    start_or_say_how(
        plan,
        target.root,
        target.kind,
        target.env_file,
        UNIT,
        f"{sys.executable} -m fitbox central serve",
    )
    home = env["FITBOX_HOME"]
    plan.notes.append(
        f"boxes join with a worker key: fitbox central keys create --scope worker "
        f"--home {home} (it prints the command a new box runs)"
    )
    return plan


def plan_central_uninstall(target: CentralLayout, purge: bool) -> Plan:
    plan = Plan(target, read_env(target.env_file))
    if target.root == Path("/") and systemd_running():
        scope = ["--user"] if target.kind == "user" else []
        plan.steps.append(Step(f"systemctl disable --now {UNIT}", partial(_quiet_disable, scope)))
    for path in (target.unit_file, target.env_file):
        plan.steps.append(Step(f"remove {path}", partial(path.unlink, missing_ok=True)))
    if purge:
        plan.steps.append(
            Step(
                f"remove {target.home.path} (the store, with each box's key)",
                partial(shutil.rmtree, target.home.path, True),
            )
        )
    return plan


def _quiet_disable(scope: list[str]) -> None:
    import subprocess

    subprocess.run(["systemctl", *scope, "disable", "--now", UNIT], check=False)


def install_central(
    target: CentralLayout,
    host: str | None,
    port: str | None,
    extra_env: dict[str, str],
    dry_run: bool,
    health_s: float,
) -> int:
    plan = plan_central_install(target, host=host, port=port, extra_env=extra_env)
    carry_out(plan, dry_run)
    if dry_run:
        return 0
    url = f"http://{plan.env['FITBOX_HOST']}:{plan.env['FITBOX_PORT']}"
    healthy = plan.starts_service and wait_for_health(url, health_s)
    state = (
        "answering"
        if healthy
        else "NOT answering"
        if plan.starts_service
        else "not started by install"
    )
    print(f"fitbox central: {url} ({state}); its store in {target.home.store}", file=sys.stderr)
    return 0 if healthy or not plan.starts_service else 1
