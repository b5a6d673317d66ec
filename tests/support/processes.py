"""fitbox run as a real process: started on an ``auto`` port, found by its endpoint.json,
stopped with SIGTERM (and its stacks printed when a stop hangs)."""

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


@dataclass
class FitboxProcess:
    proc: subprocess.Popen[bytes]
    url: str
    home: Path
    log_path: Path
    children: list[int] = field(default_factory=list)
    # what the tests send it: its admin key where they are not the box itself (netns.py)
    headers: dict[str, str] = field(default_factory=dict)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def calls(self, settle: float = 120.0) -> list[dict[str, Any]]:
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
        data = httpx.get(f"{self.url}/v1/models", headers=self.headers, timeout=10).json()["data"]
        return {m["id"]: m for m in data}


def start_fitbox(
    home: Path,
    models: list[Path],
    *extra: str,
    env: dict[str, str] | None = None,
    log_path: Path | None = None,
    wrap: tuple[str, ...] = (),
) -> FitboxProcess:
    """``log_path``: where fitbox's own output goes when not in the home (a home on a drive
    the test fills, or one fitbox must make itself); ``wrap``: a command fitbox is started
    through (tests/support/unprivileged.py)."""
    if log_path is None:
        home.mkdir(parents=True, exist_ok=True)
        log_path = home / "serve.log"
    argv = [*wrap, sys.executable, "-m", "fitbox", "serve", "--port", "auto", "--home", str(home)]
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
        url = answering_url(proc, home / "endpoint.json", log_path)
    except BaseException:
        proc.kill()  # never left running behind a failed start
        proc.wait()
        raise
    return FitboxProcess(proc, url, home, log_path)


def answering_url(proc: subprocess.Popen[bytes], endpoint: Path, log_path: Path) -> str:
    """The URL once fitbox answers /health there. endpoint.json is written in place, so a
    read can find it empty or half written: that is "not yet", like a missing file. The
    bound is a net for a hang: a start on a loaded 2-core box can take a minute."""
    deadline = time.monotonic() + 300
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
    wrap: tuple[str, ...] = (),
) -> Iterator[FitboxProcess]:
    box = start_fitbox(home, models, *extra, env=env, log_path=log_path, wrap=wrap)
    try:
        yield box
    finally:
        stop_fitbox(box)
