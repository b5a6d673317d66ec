"""Build fitbox wheels of any version from this checkout, offline (hatchling's PEP 517 hook),
for the update and .deb tests."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from .paths import REPO


def build_wheel(version: str, out: Path, *, break_serve: bool = False) -> Path:
    """A wheel of this checkout as ``version``; ``break_serve`` makes `fitbox serve` die at
    start (a release whose health check must fail)."""
    src = out / f"src-{version}"
    for name in ("src", "migrations"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("README.md",):
        shutil.copy(REPO / name, src / name)
    project = (REPO / "pyproject.toml").read_text()
    (src / "pyproject.toml").write_text(
        project.replace('version = "0.1.0"', f'version = "{version}"', 1)
    )
    if break_serve:
        app = src / "src" / "fitbox" / "server" / "app.py"
        app.write_text(app.read_text() + "\nraise RuntimeError('this release is broken')\n")
    built = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from hatchling.build import build_wheel; print(build_wheel(sys.argv[1]))",
            str(out),
        ],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return out / built.stdout.strip().splitlines()[-1]
