"""The coding agents and chat tools ``fitbox launch`` and ``fitbox config`` point at a box,
installed once from their registries and reused: the npm ones into one prefix, aider and
llm into one venv, each under ``~/.cache/fitbox-tests/`` named by a digest of the pinned
list (a new pin installs afresh). Versions are pinned: the config formats were read off
these versions (src/fitbox/harness/tools.py).

An install that fails skips the tests that need it, naming why; with FITBOX_REQUIRE_TOOLS=1
(.ci/run sets it) it fails them instead, as tests/support/tools.py does.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(os.environ.get("FITBOX_TF_TEST_VENVS", Path.home() / ".cache" / "fitbox-tests"))
NPM_TOOLS = (
    "opencode-ai@1.18.33",
    "@openai/codex@0.171.0",
    "@anthropic-ai/claude-code@2.1.197",
    "@continuedev/cli@1.5.47",
    "@mariozechner/pi-coding-agent@0.73.1",
    "@qwen-code/qwen-code@0.15.10",
)
PIP_TOOLS = ("aider-chat==0.86.2", "llm==0.30")


def _digest(items: tuple[str, ...]) -> str:
    return hashlib.sha256("\n".join(items).encode()).hexdigest()[:12]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _missing(why: str) -> None:
    if os.environ.get("FITBOX_REQUIRE_TOOLS"):
        pytest.fail(why)
    pytest.skip(why)


def npm_bin() -> Path:
    """The folder of the npm tools' commands (opencode, codex, claude, cn, pi, qwen)."""
    if shutil.which("npm") is None:
        _missing("npm is not installed: apt-get install -y npm")
    prefix = ROOT / f"npm-tools-{_digest(NPM_TOOLS)}"
    done = prefix / "installed"
    with _locked(prefix.with_suffix(".lock")):
        if not done.exists():
            shutil.rmtree(prefix, ignore_errors=True)
            prefix.mkdir(parents=True)
            result = subprocess.run(
                ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(prefix), *NPM_TOOLS],
                capture_output=True,
                text=True,
                timeout=1500,
            )
            if result.returncode != 0:
                _missing(f"npm install of the tools failed:\n{result.stderr[-3000:]}")
            done.write_text("\n".join(NPM_TOOLS) + "\n")
    return prefix / "node_modules" / ".bin"


def pip_bin() -> Path:
    """The folder of aider's and llm's commands, in a venv of their own."""
    venv = ROOT / f"aider-{_digest(PIP_TOOLS)}"
    done = venv / "installed"
    with _locked(venv.with_suffix(".lock")):
        if not done.exists():
            shutil.rmtree(venv, ignore_errors=True)
            made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True)
            result = subprocess.run(
                [str(venv / "bin" / "pip"), "install", "-q", *PIP_TOOLS],
                capture_output=True,
                text=True,
                timeout=1500,
            )
            if made.returncode != 0 or result.returncode != 0:
                _missing(f"pip install of aider and llm failed:\n{result.stderr[-3000:]}")
            done.write_text("\n".join(PIP_TOOLS) + "\n")
    return venv / "bin"
