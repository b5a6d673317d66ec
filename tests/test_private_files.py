"""What fitbox keeps is its owner's alone: a home it makes (0700), the store and its -wal and
-shm (0600: the call log, key names, salted digests), the engine logs and their folder,
as box.key always was. A home that exists keeps its mode (a system install's is 0710)."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from fitbox.store.db import CallStart, Store

from .support.processes import running_fitbox


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def store_files(store: Path) -> dict[str, int]:
    return {suffix: mode(Path(f"{store}{suffix}")) for suffix in ("", "-wal", "-shm")}


def test_a_new_store_and_the_home_it_makes_are_owner_only(tmp_path: Path) -> None:
    os.umask(0o022)  # the usual umask: what made them 0755 and 0644
    path = tmp_path / "home" / "fitbox.sqlite3"
    store = Store(path)
    try:
        store.call_started(CallStart("r1", "/x", "m", False, 0.0))
        store.flush()
        assert mode(path.parent) == 0o700
        assert store_files(path) == {"": 0o600, "-wal": 0o600, "-shm": 0o600}
    finally:
        store.close()


def test_a_store_an_older_fitbox_left_readable_is_narrowed(tmp_path: Path) -> None:
    path = tmp_path / "fitbox.sqlite3"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x)")
    path.chmod(0o644)
    tmp_path.chmod(0o755)
    Store(path).close()
    assert mode(path) == 0o600
    assert mode(tmp_path) == 0o755  # a home that exists keeps its mode


@pytest.mark.engine
def test_a_serve_keeps_its_home_store_and_engine_logs_owner_only(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    home = tmp_path / "made-by-fitbox"  # fitbox makes it: start_fitbox does not
    with running_fitbox(home, [smollm2.parent], log_path=tmp_path / "serve.log") as box:
        body = {
            "model": "SmolLM2-135M-Instruct.Q4_1",
            "max_tokens": 2,
            "messages": [{"role": "user", "content": "hi"}],
        }
        reply = httpx.post(f"{box.url}/v1/chat/completions", json=body, timeout=120)
        assert reply.status_code == 200
        files = store_files(home / "fitbox.sqlite3")
        logs = home / "logs"
        engine_logs = {p.name: mode(p) for p in logs.iterdir()}
    assert mode(home) == 0o700 and files == {"": 0o600, "-wal": 0o600, "-shm": 0o600}
    assert mode(logs) == 0o700 and engine_logs and set(engine_logs.values()) == {0o600}
    assert mode(home / "box.key") == 0o600


def test_a_user_install_makes_its_home_owner_only(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}  # no XDG_*: all under HOME
    env.update({k: v for k, v in os.environ.items() if k == "PYTHONPATH"})  # this checkout's
    argv = [sys.executable, "-m", "fitbox", "install", "--user", "--port", "auto", "--yes"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    home = tmp_path / ".local" / "share" / "fitbox"
    assert mode(home) == 0o700 and mode(home / "fitbox.sqlite3") == 0o600
