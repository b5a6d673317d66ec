"""Children left behind by an earlier fitbox are stopped at the next start; a process that
merely reuses a recorded pid is never touched."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import psutil

from fitbox.store.db import Store

from .support.processes import running_fitbox, start_fitbox, stop_fitbox

STOP_BOUND_S = 60


def record(home: Path, proc: subprocess.Popen[bytes], create_time: float) -> None:
    with sqlite3.connect(home / "fitbox.sqlite3") as conn:
        conn.execute(
            "INSERT INTO children (pid, create_time, port, artifact, argv, started_at)"
            " VALUES (?, ?, 0, 'x', ?, ?)",
            (proc.pid, create_time, json.dumps(["sleep", "300"]), time.time()),
        )


def test_orphans_are_stopped_and_strangers_are_not(tmp_path: Path) -> None:
    home = tmp_path / "home"
    Store(home / "fitbox.sqlite3").close()  # a store an earlier fitbox left
    orphan = subprocess.Popen(["sleep", "300"], start_new_session=True)
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        record(home, orphan, psutil.Process(orphan.pid).create_time())
        record(home, stranger, psutil.Process(stranger.pid).create_time() - 100)  # pid reused
        with running_fitbox(home, [tmp_path / "models"]):
            orphan.wait(timeout=10)  # stopped at start
            assert stranger.poll() is None  # not ours: left alone
        with sqlite3.connect(home / "fitbox.sqlite3") as conn:
            how = dict(conn.execute("SELECT pid, ended_how FROM children"))
        assert how == {orphan.pid: "reaped at start", stranger.pid: "gone"}
    finally:
        for proc in (orphan, stranger):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_every_child_is_recorded_and_closed(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    import httpx

    home = tmp_path / "home"
    box = start_fitbox(home, [smollm2.parent])
    try:
        httpx.post(
            f"{box.url}/v1/completions",
            timeout=60,
            json={"model": "smollm2", "prompt": "hi", "max_tokens": 1},
        )
    finally:
        # past fitbox's own bounds on a stop (uvicorn's 5 s, stop_grace 5 s, the log pump's
        # 5 s, the store's drain): a slow or stalled machine is waited out, never raced
        code = stop_fitbox(box, timeout=STOP_BOUND_S)
    # uvicorn re-raises the signal once the stop is done: -SIGTERM is a stop that finished
    assert code == -signal.SIGTERM, f"fitbox's stop did not finish ({code}):\n{box.log()[-6000:]}"
    with sqlite3.connect(home / "fitbox.sqlite3") as conn:
        rows = conn.execute("SELECT pid, ended_how, argv FROM children").fetchall()
    assert len(rows) == 1 and rows[0][1] == "stopped"
    assert "llama-server" in json.loads(rows[0][2])[0]
