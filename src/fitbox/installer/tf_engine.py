"""`fitbox install --tf`: the transformers engine's own venv, built from fitbox's extra.

The requirements are the ``tf-engine`` extra of fitbox's own package (pyproject.toml), read
from the installed metadata (or, in a source tree installed before the extra existed, from
pyproject.toml beside it). The venv is built beside its final place and renamed into it, so
a half-built one is never found by the engine's discovery. bitsandbytes (the 4bit rung, on
CUDA and on the CPU) is in the extra where it has wheels; `fitbox engines` says whether it
imports.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, requires
from pathlib import Path

EXTRA = "tf-engine"
BUILT_FROM = "fitbox-requirements.txt"  # in the venv: the list it was built from
PIP_TIMEOUT_S = 1800
_EXTRA_MARKER = re.compile(r";\s*extra\s*==\s*['\"]" + re.escape(EXTRA) + r"['\"]\s*$")


class EngineBuildFailed(RuntimeError):
    pass


def requirements() -> list[str]:
    """The ``tf-engine`` extra's requirements, in the order pyproject.toml lists them. A
    source tree's pyproject.toml wins over the installed metadata: an editable install's
    metadata is as old as its last ``pip install`` and misses an extra edited since."""
    project = Path(__file__).resolve().parents[3] / "pyproject.toml"
    if project.is_file():
        extras = tomllib.loads(project.read_text())["project"].get("optional-dependencies", {})
        if extras.get(EXTRA):
            return list(extras[EXTRA])
    try:
        listed = [
            _EXTRA_MARKER.sub("", r).strip()
            for r in requires("fitbox") or []
            if _EXTRA_MARKER.search(r)
        ]
    except PackageNotFoundError:
        listed = []
    if listed:
        return listed
    raise EngineBuildFailed(f"fitbox's metadata has no '{EXTRA}' extra; reinstall fitbox")


def requirements_key(reqs: list[str]) -> str:
    """A short digest of the requirement list (a cache of built venvs is keyed by it)."""
    return hashlib.sha256("\n".join(reqs).encode()).hexdigest()[:16]


def _run(argv: list[str], what: str) -> None:
    print(f"+ {' '.join(argv)}", flush=True)
    done = subprocess.run(argv, timeout=PIP_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise EngineBuildFailed(
            f"{what} failed (exit {done.returncode}); the output above says why"
        )


def build_venv(target: Path, reqs: list[str], *, python: str = sys.executable) -> Path:
    """Build a venv at ``target`` holding ``reqs``; returns its interpreter."""
    building = target.with_name(f"{target.name}.building-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    building.parent.mkdir(parents=True, exist_ok=True)
    try:
        _run([python, "-m", "venv", str(building)], "creating the venv")
        pip = [str(building / "bin" / "python"), "-m", "pip", "install", "--quiet"]
        _run([*pip, *reqs], "installing the engine's packages")
        (building / BUILT_FROM).write_text("\n".join(reqs) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        os.rename(building, target)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return target / "bin" / "python"


def built_from(target: Path) -> list[str] | None:
    """The requirement list a venv fitbox built holds, one a line (a requirement with an
    environment marker has spaces); None: not one of fitbox's."""
    try:
        return [ln.strip() for ln in (target / BUILT_FROM).read_text().splitlines() if ln.strip()]
    except OSError:
        return None


def install_tf(engines_dir: Path, support: Path | None = None) -> int:
    """``fitbox install --tf``: build ``<engines dir>/tf`` (kept when it was built from the
    same requirements and still imports them: a re-run is safe), then probe it and record
    what its transformers loads at ``support`` (the catalog judges folders by it)."""
    from fitbox.engines.tf import probe, venv_dir, write_support

    target = venv_dir(engines_dir)
    reqs = requirements()
    python = target / "bin" / "python"
    try:
        if built_from(target) == reqs and probe(python).usable:
            print(f"kept {target}: built from the same requirements")
        else:
            python = build_venv(target, reqs)
    except (EngineBuildFailed, OSError, subprocess.TimeoutExpired) as exc:
        print(f"fitbox install --tf: {exc}", file=sys.stderr)
        return 1
    found = probe(python, full=True)
    if not found.usable:
        print(f"fitbox install --tf: {python} was built but {found.problem}", file=sys.stderr)
        return 1
    write_support(support, found)
    four = "yes" if found.four_bit else f"no: {found.four_bit_problem()}"
    print(
        f"transformers engine ready: {python} (torch {found.modules.get('torch')}, "
        f"transformers {found.modules.get('transformers')}; 4-bit: {four})"
    )
    return 0
