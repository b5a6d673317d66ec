"""Load-to-ready: how soon fitbox sees a child ready, against the engine's own readiness.

Baseline: llama-server launched directly with the argv fitbox would use, its /health polled
every millisecond from the moment of launch. Through fitbox: a cold call on a fresh
fitbox; the call log's load_start_at -> load_ready_at is when fitbox launched the child and
when it saw it ready; the client also times the whole cold call.

    python bench/load_to_ready.py [--rounds 5]

Target: fitbox sees readiness within ~50 ms of the child being ready.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from fitbox.engines.child import free_port
from fitbox.engines.llama_server import LaunchIntent, build_argv, find_binary, inspect
from fitbox.models.pull import pull

REPO = Path(__file__).resolve().parents[1]
BODY = {"model": "smollm2", "prompt": "Hi", "max_tokens": 1}


def health_ok(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return sock.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def direct_ready(model: Path) -> float:
    engine = inspect(find_binary().path)
    port = free_port()
    intent = LaunchIntent(
        model_path=model, alias="smollm2", window=4096, parallel=1, gpu_layers=0, port=port
    )
    started = time.perf_counter()
    proc = subprocess.Popen(
        build_argv(engine, intent),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        while not health_ok(port):
            if proc.poll() is not None:
                raise SystemExit("llama-server exited")
            time.sleep(0.001)
        return time.perf_counter() - started
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def fitbox_ready(models: Path) -> tuple[float, float]:
    """(seconds from launching the child to fitbox seeing it ready, whole cold call)."""
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        proc = subprocess.Popen(
            [sys.executable, "-m", "fitbox", "serve", "--port", "auto", "--home", str(home),
             "--models", str(models), "--log-level", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            while not (home / "endpoint.json").exists():
                time.sleep(0.01)
            url = json.loads((home / "endpoint.json").read_text())["url"]
            while True:
                try:
                    httpx.get(f"{url}/health")
                    break
                except httpx.TransportError:
                    time.sleep(0.01)
            started = time.perf_counter()
            httpx.post(f"{url}/v1/completions", json=BODY, timeout=120).raise_for_status()
            whole = time.perf_counter() - started
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        with sqlite3.connect(home / "fitbox.sqlite3") as conn:
            start, ready = conn.execute(
                "SELECT load_start_at, load_ready_at FROM call_log ORDER BY id LIMIT 1"
            ).fetchone()
        return ready - start, whole


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    model = pull("smollm2", Path(os.environ.get("FITBOX_TEST_CACHE", REPO / ".cache")) / "models")
    direct, seen, whole = [], [], []
    for _ in range(args.rounds):  # interleaved, so page cache and load are shared
        direct.append(direct_ready(model))
        ready, call = fitbox_ready(model.parent)
        seen.append(ready)
        whole.append(call)
    d, f, w = (statistics.median(x) * 1000 for x in (direct, seen, whole))
    print(f"load-to-ready, SmolLM2-135M Q4_1 on CPU ({args.rounds} rounds each, medians)")
    print(f"  direct llama-server, /health polled every 1 ms   {d:8.1f} ms")
    print(
        f"  fitbox launch -> fitbox sees ready               {f:8.1f} ms   added {f - d:+6.1f} ms"
        f"   ratio {f / d:.3f}"
    )
    print(f"  fitbox cold call, client-side (load + 1 token)   {w:8.1f} ms")
    deltas = [round((b - a) * 1000, 1) for a, b in zip(direct, seen, strict=True)]
    print(f"  per round, fitbox - direct (ms): {deltas}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
