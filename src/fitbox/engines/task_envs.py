"""A task runner's environment: where it is, what state it is in, and its build.

Each runner (engines/task_runners.py) runs in ``<engine dir>/<runner>``, a venv built from
the runner's extra of fitbox's own package. Its state is read from disk, so ``fitbox
engines`` (another process) sees what a serving fitbox is doing:

- ready: the venv holds ``fitbox-requirements.txt`` with today's requirement list;
- building: ``<runner>.building-<pid>`` exists and that process is alive;
- failed: ``<runner>.failed`` says why, for today's requirement list: it is not retried
  by calls (no build loop); ``fitbox install --tasks`` (or a changed extra) tries again;
- missing: none of these (or a venv built from another list).

A call for a runner whose environment is missing starts its build in a thread (off the
request path) and is refused as data (errors.EngineEnvBuilding: 503 with Retry-After).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, requires
from pathlib import Path
from typing import IO

from fitbox.engines.task_runners import RunnerSpec

BUILT_FROM = "fitbox-requirements.txt"  # in the venv: the list it was built from
PIP_TIMEOUT_S = 1800
RETRY_AFTER_S = 30.0  # what a call refused while the environment builds is told to wait
PROBE_S = 120
_BUILDS: dict[Path, threading.Thread] = {}  # this process's builds, by target
_BUILDS_LOCK = threading.Lock()


class EnvBuildFailed(RuntimeError):
    pass


@lru_cache(maxsize=16)  # asked by each call while an environment is not ready
def _extra(extra: str) -> tuple[str, ...]:
    return tuple(_read_extra(extra))


def extra_requirements(extra: str) -> list[str]:
    return list(_extra(extra))


def _read_extra(extra: str) -> list[str]:
    """The ``extra`` list of fitbox's optional dependencies: a source tree's pyproject.toml
    first (an editable install's metadata misses an extra edited since), else the
    installed metadata."""
    project = Path(__file__).resolve().parents[3] / "pyproject.toml"
    if project.is_file():
        extras = tomllib.loads(project.read_text())["project"].get("optional-dependencies", {})
        if extras.get(extra):
            return list(extras[extra])
    marker = re.compile(r";\s*extra\s*==\s*['\"]" + re.escape(extra) + r"['\"]\s*$")
    try:
        listed = [marker.sub("", r).strip() for r in requires("fitbox") or [] if marker.search(r)]
    except PackageNotFoundError:
        listed = []
    if listed:
        return listed
    raise EnvBuildFailed(f"fitbox's metadata has no '{extra}' extra; reinstall fitbox")


def requirements_key(reqs: list[str]) -> str:
    """A short digest of a requirement list (tests key their cached venvs by it)."""
    return hashlib.sha256("\n".join(reqs).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class EnvState:
    """One runner's environment as the disk says it is now."""

    runner: str
    path: Path
    state: str  # ready | building | failed | missing
    reason: str = ""  # why it failed, or what is missing

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"


def env_dir(engines: Path, spec: RunnerSpec) -> Path:
    return engines / spec.name


def _failed_file(target: Path) -> Path:
    return target.with_name(f"{target.name}.failed")


def _building_pid(target: Path) -> int | None:
    """The live process building ``target``, if one is."""
    for found in target.parent.glob(f"{target.name}.building-*"):
        try:
            pid = int(found.name.rsplit("-", 1)[1])
            os.kill(pid, 0)
        except (ValueError, ProcessLookupError, PermissionError):
            continue
        return pid
    return None


def state_of(engines: Path, spec: RunnerSpec) -> EnvState:
    target = env_dir(engines, spec)
    reqs = extra_requirements(spec.extra)
    try:
        built = (target / BUILT_FROM).read_text().split("\n")
    except OSError:
        built = None
    if built is not None and [r for r in built if r] == reqs:
        return EnvState(spec.name, target, "ready")
    if (pid := _building_pid(target)) is not None:
        return EnvState(spec.name, target, "building", f"being built by process {pid}")
    try:
        failed = json.loads(_failed_file(target).read_text())
    except (OSError, ValueError):
        failed = None
    if isinstance(failed, dict) and failed.get("requirements") == reqs:
        return EnvState(spec.name, target, "failed", str(failed.get("reason", "")))
    why = "built from another requirement list" if built is not None else "not built"
    return EnvState(spec.name, target, "missing", why)


def start_build(engines: Path, spec: RunnerSpec) -> bool:
    """Build the runner's environment in a thread of this process, unless one is building
    it already; returns whether this call started it."""
    target = env_dir(engines, spec)
    with _BUILDS_LOCK:
        running = _BUILDS.get(target)
        if running is not None and running.is_alive():
            return False
        thread = threading.Thread(
            target=_build_quietly, args=(engines, spec), daemon=True, name=f"build-{spec.name}"
        )
        _BUILDS[target] = thread
        thread.start()
    return True


def _build_quietly(engines: Path, spec: RunnerSpec) -> None:
    with contextlib.suppress(EnvBuildFailed):  # recorded in <runner>.failed: calls and
        build(engines, spec)  # `fitbox engines` say why


def build(engines: Path, spec: RunnerSpec, python: str = sys.executable) -> Path:
    """Build ``<engines>/<runner>`` from its extra (beside its place, renamed into it: a
    half-built one is never taken for ready), then import its modules there. A failure is
    written to ``<runner>.failed`` with the end of the build's output and raised."""
    target = env_dir(engines, spec)
    reqs = extra_requirements(spec.extra)
    building = target.with_name(f"{target.name}.building-{os.getpid()}")
    log = target.with_name(f"{target.name}.build.log")
    building.parent.mkdir(parents=True, exist_ok=True)
    if (other := _building_pid(target)) not in (None, os.getpid()):
        raise EnvBuildFailed(f"process {other} is building {target} now")
    for left in target.parent.glob(f"{target.name}.building-*"):  # a build cut off by its
        shutil.rmtree(left, ignore_errors=True)  # process's end
    _failed_file(target).unlink(missing_ok=True)
    try:
        with log.open("w") as out:
            _run([python, "-m", "venv", str(building)], out, "creating the venv")
            pip = [str(building / "bin" / "python"), "-m", "pip", "install", "--quiet"]
            _run([*pip, *reqs], out, f"installing {' '.join(reqs)}")
            _run([str(building / "bin" / "python"), "-c", probe_code(spec)], out, "importing")
        (building / BUILT_FROM).write_text("\n".join(reqs) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        os.rename(building, target)
    except (EnvBuildFailed, OSError, subprocess.TimeoutExpired) as exc:
        reason = f"{exc}; the end of {log}: {_tail(log)}"
        _failed_file(target).write_text(json.dumps({"requirements": reqs, "reason": reason}))
        raise EnvBuildFailed(reason) from None
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return target / "bin" / "python"


def probe_code(spec: RunnerSpec) -> str:
    return "; ".join(f"import {module}" for module in spec.modules)


def _run(argv: list[str], out: IO[str], what: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    done = subprocess.run(
        argv,
        stdout=out,
        stderr=subprocess.STDOUT,
        timeout=PIP_TIMEOUT_S,
        check=False,
        env=env,
    )
    if done.returncode != 0:
        raise EnvBuildFailed(f"{what} failed (exit {done.returncode})")


def _tail(log: Path, lines: int = 3) -> str:
    try:
        text = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no output"
    kept = [line for line in text if line.strip() and not line.startswith("WARNING: Location")]
    return " | ".join(kept[-lines:]) or "no output"
