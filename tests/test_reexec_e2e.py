"""Restarts without a cold start (#38), on a real fitbox and real llama-server children.

SIGHUP re-executes fitbox in place: the streams in flight finish whole, calls arriving
meanwhile wait in the socket's backlog and are served by the new image, and the engine is
adopted, not reloaded. After a kill -9, the children that survived are adopted when they
are the engines recorded, reaped otherwise, never both. Each hold is an event the test
controls (a SIGSTOPped engine, tests/support/holds.py), never an elapsed time.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import psutil

from .support.holds import HOLD_IDLE_TIMEOUT, calls_on, engine_stopped, resident, until
from .support.processes import FitboxProcess, answering_url, start_fitbox, stop_fitbox

SMOL = "SmolLM2-135M-Instruct.Q4_1"
STOP_BOUND_S = 60


def chat(model: str, **extra: object) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": "Count."}], **extra}


def streamed(box: FitboxProcess, model: str, tokens: int) -> list[str]:
    """A whole stream's data events (its last must be [DONE])."""
    body = chat(model, max_tokens=tokens, stream=True, ignore_eos=True)
    with httpx.stream("POST", f"{box.url}/v1/chat/completions", json=body, timeout=300) as r:
        assert r.status_code == 200, r.read()
        return [line[6:] for line in r.iter_lines() if line.startswith("data: ")]


def in_threads(count: int, work: Any) -> tuple[list[Any], list[threading.Thread]]:
    """``work()`` in ``count`` threads; each result (or the exception raised) lands in the
    returned list once its thread ends."""
    results: list[Any] = []

    def run() -> None:
        try:
            results.append(work())
        except Exception as exc:
            results.append(exc)

    threads = [threading.Thread(target=run, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    return results, threads


def load_ms(response: httpx.Response) -> float:
    timing = dict(
        part.strip().split(";dur=") for part in response.headers["server-timing"].split(",")
    )
    return float(timing["load"])


def completion(box: FitboxProcess, model: str) -> httpx.Response:
    body = chat(model, max_tokens=4)
    return httpx.post(f"{box.url}/v1/chat/completions", json=body, timeout=300)


def llama_servers_of(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def test_sighup_under_streams_keeps_the_engine_and_serves_what_waited(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    box = start_fitbox(tmp_path / "home", [smollm2.parent], env=HOLD_IDLE_TIMEOUT)
    try:
        first = completion(box, SMOL)
        assert first.status_code == 200 and load_ms(first) > 0
        pid = int(resident(box, SMOL)["pid"])
        with engine_stopped(box, SMOL):
            streams, stream_threads = in_threads(3, lambda: streamed(box, SMOL, 48))
            until(lambda: calls_on(box, SMOL) == 3, "three streams in flight on the engine")
            box.proc.send_signal(signal.SIGHUP)
            until(lambda: "Shutting down" in box.log(), "the old image stops accepting")
            arrived, arrived_threads = in_threads(2, lambda: completion(box, SMOL))
        for thread in [*stream_threads, *arrived_threads]:
            thread.join(timeout=300)
        for events in streams:
            assert not isinstance(events, Exception), events
            assert events[-1] == "[DONE]"  # whole: cut streams end without it
            chunks = [json.loads(e) for e in events[:-1]]
            assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == (
                "length"
            )
        assert len(arrived) == 2
        for answer in arrived:
            assert not isinstance(answer, Exception), answer
            assert answer.status_code == 200, answer.text
        assert "adopted on port" in box.log() and box.proc.poll() is None
        again = completion(box, SMOL)
        assert again.status_code == 200 and load_ms(again) == 0  # not reloaded
        assert int(resident(box, SMOL)["pid"]) == pid  # the same engine, kept
    finally:
        code = stop_fitbox(box, timeout=STOP_BOUND_S)
    assert code == -signal.SIGTERM, box.log()[-6000:]
    assert llama_servers_of([pid]) == []  # nothing orphaned
    with sqlite3.connect(box.home / "fitbox.sqlite3") as conn:
        rows = conn.execute("SELECT pid, ended_how FROM children").fetchall()
    assert rows == [(pid, "stopped")]  # one engine, launched once, stopped once


SETPRIV_WITHOUT_PDEATHSIG = """#!/bin/sh
# setpriv that drops --pdeathsig: the engines outlive a kill -9 of fitbox, as they do where
# PR_SET_PDEATHSIG cannot act
[ "$1" = --pdeathsig ] && shift 2
exec "$@"
"""


def survivors_env(tmp_path: Path) -> dict[str, str]:
    shims = tmp_path / "shims"
    shims.mkdir()
    setpriv = shims / "setpriv"
    setpriv.write_text(SETPRIV_WITHOUT_PDEATHSIG)
    setpriv.chmod(0o755)
    return {**HOLD_IDLE_TIMEOUT, "PATH": f"{shims}:{os.environ['PATH']}"}


def ready_rows(home: Path) -> dict[str, tuple[int, int, str]]:
    """artifact -> (row id, pid, argv) of each open child whose placement is recorded."""
    with sqlite3.connect(home / "fitbox.sqlite3") as conn:
        rows = conn.execute(
            "SELECT id, pid, artifact, argv FROM children"
            " WHERE ended_at IS NULL AND placement IS NOT NULL"
        ).fetchall()
    return {Path(artifact).stem: (row_id, pid, argv) for row_id, pid, artifact, argv in rows}


def test_after_kill_9_survivors_are_adopted_or_reaped_never_both(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    models = tmp_path / "models"
    models.mkdir()
    os.link(smollm2, models / smollm2.name)
    os.link(smollm2, models / "tampered.gguf")
    home, env = tmp_path / "home", survivors_env(tmp_path)
    box = start_fitbox(home, [models], env=env)
    pids: list[int] = []
    try:
        for model in (SMOL, "tampered"):
            assert completion(box, model).status_code == 200
        rows = until(lambda: r if len(r := ready_rows(home)) == 2 else None, "both recorded")
        pids = [rows[SMOL][1], rows["tampered"][1]]
        tampered = [*json.loads(rows["tampered"][2]), "--not-what-was-launched"]
        with sqlite3.connect(home / "fitbox.sqlite3") as conn:
            conn.execute(
                "UPDATE children SET argv = ? WHERE id = ?",
                (json.dumps(tampered), rows["tampered"][0]),
            )
        box.proc.kill()  # kill -9: nothing of fitbox's own runs
        box.proc.wait(timeout=30)
        assert llama_servers_of(pids) == pids  # both survived it
        again = start_fitbox(home, [models], env=env)
        try:
            kept, reaped = pids
            until(lambda: llama_servers_of([reaped]) == [], "the tampered one reaped")
            assert llama_servers_of([kept]) == [kept]  # adopted, not stopped
            answer = completion(again, SMOL)
            assert answer.status_code == 200 and load_ms(answer) == 0
            assert int(resident(again, SMOL)["pid"]) == kept
            with sqlite3.connect(home / "fitbox.sqlite3") as conn:
                how = dict(conn.execute("SELECT pid, ended_how FROM children"))
            assert how[reaped] == "reaped at start"
            assert how[kept] is None  # open: adopted, never both adopted and reaped
            assert f"pid {reaped} left running" in again.log()
            assert f"(pid {kept}): ready, not reloaded" in again.log()
        finally:
            code = stop_fitbox(again, timeout=STOP_BOUND_S)
        assert code == -signal.SIGTERM, again.log()[-6000:]
        assert llama_servers_of(pids) == []
    finally:
        for pid in llama_servers_of(pids):  # never left behind by a failed test
            os.killpg(pid, signal.SIGKILL)
        stop_fitbox(box)


# systemd's socket activation without systemd: the socket is the test's (as fitbox.socket
# is systemd's), moved to fd 3 and announced to the very pid that runs fitbox
EMULATED_ACTIVATION = """
import os, sys
fd = int(os.environ.pop("FD"))
if fd != 3:
    os.dup2(fd, 3)
    os.close(fd)
os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS="1")
os.execv(sys.argv[1], sys.argv[1:])
"""


def serve_argv(home: Path, models: Path) -> list[str]:
    serve = ["serve", "--port", "auto", "--home", str(home), "--models", str(models)]
    return [sys.executable, "-m", "fitbox", *serve]


def activated(home: Path, models: Path, sock: socket.socket) -> FitboxProcess:
    """fitbox started as systemd starts a socket-activated service, on ``sock``."""
    home.mkdir(parents=True, exist_ok=True)
    log_path = home / "serve.log"
    fd = sock.fileno()
    with log_path.open("ab") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-c", EMULATED_ACTIVATION, *serve_argv(home, models)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            pass_fds=(fd,),
            env={**os.environ, "FD": str(fd), "PYTHONFAULTHANDLER": "1"},
        )
    url = answering_url(proc, home / "endpoint.json", log_path)
    return FitboxProcess(proc, url, home, log_path)


def test_a_socket_activated_fitbox_serves_on_the_socket_it_is_handed(
    tmp_path: Path, smollm2: Path
) -> None:
    """systemd-socket-activate where it is installed (it starts fitbox on the first
    connection, which waits in the backlog meanwhile); else the emulation above."""
    home, tool = tmp_path / "home", shutil.which("systemd-socket-activate")
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    if tool is None:
        with socket.create_server(("127.0.0.1", port), backlog=128) as sock:
            box = activated(home, smollm2.parent, sock)
        served = httpx.get(f"{box.url}/health", timeout=120)
    else:
        home.mkdir(parents=True)
        with (home / "serve.log").open("wb") as log_file:
            proc = subprocess.Popen(
                [tool, "-l", f"127.0.0.1:{port}", *serve_argv(home, smollm2.parent)],
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )
        box = FitboxProcess(proc, f"http://127.0.0.1:{port}", home, home / "serve.log")
        # the first connection starts it: this call waits in the backlog, then is served
        served = httpx.get(f"{box.url}/health", timeout=120)
    try:
        assert served.status_code == 200, box.log()
        assert json.loads((home / "endpoint.json").read_text())["port"] == port
        assert box.proc.pid == json.loads((home / "endpoint.json").read_text())["pid"]
    finally:
        code = stop_fitbox(box, timeout=STOP_BOUND_S)
    assert code == -signal.SIGTERM, box.log()[-6000:]


def test_the_socket_keeps_accepting_across_a_full_stop_and_start(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    """A call made while no fitbox runs waits in the held socket's backlog and is served by
    the next one, as fitbox.socket holds the port across `systemctl restart fitbox`."""
    home = tmp_path / "home"
    with socket.create_server(("127.0.0.1", 0), backlog=128) as sock:
        first = activated(home, smollm2.parent, sock)
        try:
            assert completion(first, SMOL).status_code == 200
        finally:
            assert stop_fitbox(first, timeout=STOP_BOUND_S) == -signal.SIGTERM, first.log()
        waited, threads = in_threads(1, lambda: completion(first, SMOL))  # none serving
        second = activated(home, smollm2.parent, sock)
        try:
            threads[0].join(timeout=300)
            assert second.url == first.url
            (answer,) = waited
            assert not isinstance(answer, Exception), answer
            assert answer.status_code == 200, answer.text
        finally:
            code = stop_fitbox(second, timeout=STOP_BOUND_S)
    assert code == -signal.SIGTERM, second.log()[-6000:]
