"""`fitbox update` against a package index served on loopback: real wheels of this checkout
at other versions, installed into a scratch virtual environment."""

from __future__ import annotations

import hashlib
import site
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .support.local_http import serve_directory
from .support.wheels import build_wheel

GOOD, BROKEN, BAD_HASH, OLD = "9.0.1", "9.0.2", "9.0.3", "9.0.0"


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A PEP 503 index: fitbox 9.0.0, 9.0.1, 9.0.2 (whose serve dies at start), and 9.0.3
    listed with a sha256 that is not its own."""
    root = tmp_path_factory.mktemp("index")
    files = root / "files"
    files.mkdir()
    wheels = {v: build_wheel(v, files, break_serve=v == BROKEN) for v in (OLD, GOOD, BROKEN)}
    wheels[BAD_HASH] = build_wheel(BAD_HASH, files)
    links = []
    for version, wheel in wheels.items():
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if version == BAD_HASH:
            digest = "0" * 64
        links.append(f'<a href="../../files/{wheel.name}#sha256={digest}">{wheel.name}</a>')
    (root / "simple" / "fitbox").mkdir(parents=True)
    (root / "simple" / "fitbox" / "index.html").write_text("<html><body>" + "".join(links))

    with serve_directory(root) as base:
        yield f"{base}/simple", wheels[OLD]


def scratch_venv(path: Path, wheel: Path) -> Path:
    """A venv with fitbox from ``wheel``; its dependencies come from this test's environment
    through a .pth line (offline, and the editable fitbox of the checkout is not on it)."""
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=120)
    python = path / "bin" / "python"
    where = "import sysconfig; print(sysconfig.get_path('purelib'))"
    purelib = subprocess.run([python, "-c", where], capture_output=True, text=True, check=True)
    deps = next(p for p in site.getsitepackages() if p.endswith("site-packages"))
    Path(purelib.stdout.strip(), "deps.pth").write_text(deps + "\n")
    subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--no-deps", str(wheel)],
        check=True,
        timeout=300,
    )
    return python


def version_in(python: Path) -> str:
    return subprocess.run(
        [python, "-c", "import fitbox; print(fitbox.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def test_update_verifies_hashes_rolls_back_and_refuses_downgrades(
    tmp_path: Path, index: tuple[str, Path]
) -> None:
    url, old_wheel = index
    python = scratch_venv(tmp_path / "venv", old_wheel)
    assert version_in(python) == OLD
    env = {"PATH": "/usr/bin:/bin", "FITBOX_HOME": str(tmp_path / "home")}

    def update(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [python, "-m", "fitbox", "update", "--index-url", url, "--health-timeout", "60", *args],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )

    told = update()
    assert told.returncode == 0 and f"fitbox {BAD_HASH} is available (installed: {OLD})" in (
        told.stdout
    )
    assert f"run 'fitbox update --apply --index-url {url}'" in told.stdout  # the index kept
    assert version_in(python) == OLD  # without --apply nothing changes

    refused = update("--apply", "--version", BAD_HASH)
    assert refused.returncode == 1 and "is not the index's" in refused.stderr
    assert version_in(python) == OLD

    applied = update("--apply", "--version", GOOD)
    assert applied.returncode == 0, applied.stderr
    assert f"{OLD} -> {GOOD}: installed, and /health reports it" in applied.stdout
    assert version_in(python) == GOOD

    rolled = update("--apply", "--version", BROKEN)
    assert rolled.returncode == 1 and "failed its health check" in rolled.stderr
    assert "this release is broken" in rolled.stderr and f"rolled back to {GOOD}" in (rolled.stderr)
    assert version_in(python) == GOOD

    down = update("--apply", "--version", OLD)
    assert down.returncode == 1 and "downgrades are refused" in down.stderr
    assert version_in(python) == GOOD
