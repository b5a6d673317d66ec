"""Load-to-ready: how soon fitbox sees a child ready, against the engine's own readiness.

Each round: a cold call on a fresh fitbox (the call log's load_start_at -> load_ready_at is
when fitbox launched the child and when it saw it ready), then the baseline: llama-server
launched directly with the very argv fitbox used for that child (the store's children row;
same threads, same warmup), its /health polled every millisecond from the moment of launch.
The client also times the whole cold call.

    python bench/load_to_ready.py [--rounds 5] [--spawn-rounds 10] [--tf-rounds 2]

Target (issue 14): fitbox launch -> ready minus direct llama-server's own under 20 ms p50.
On a loaded box two loads differ by seconds round to round, so the difference cannot show
20 ms; the parts fitbox adds are also measured on their own: the spawn (in process, below)
and how long after the child's own first 200 fitbox saw it ready (the 1 ms watcher).

Then the launch itself, in this process, interleaved: engines/child.py's Child launched
through setpriv + taskset (fitbox vforked, as it runs now) against the same Child launched
with a ``preexec_fn`` (Python forks the whole process: what fitbox did before), with this
process's heap grown to a serving fitbox's resident size (``--heap-mb``, measured 96 MB).

The transformers row (issue 16) does the same with SmolLM2 as a float32 safetensors folder
served by the transformers child (the engine venv the tests build, tests/support/tf_engine.py): a
cold chat call through fitbox, then the child launched directly with fitbox's argv and
the engine's environment. ``--tf-rounds 0`` leaves it out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple

import httpx
import psutil

from fitbox.engines import child as child_module
from fitbox.engines.child import Child, free_port
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


def direct_ready(argv: list[str], env: dict[str, str] | None = None) -> float:
    """Seconds from launching ``argv`` (its port replaced by a free one) to /health 200."""
    port = free_port()
    argv = list(argv)
    argv[argv.index("--port") + 1] = str(port)
    started = time.perf_counter()
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=env,
    )
    try:
        while not health_ok(port):
            if proc.poll() is not None:
                raise SystemExit(f"{argv[0]} exited")
            time.sleep(0.001)
        return time.perf_counter() - started
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def serving_port(argv: list[str]) -> int | None:
    """The port a child serves on; None for fitbox's engine probe (``--port 0``: it prints
    its system info and exits, engines/llama_server.py) and for anything without one."""
    with contextlib.suppress(ValueError, IndexError):
        port = int(argv[argv.index("--port") + 1])
        return port or None
    return None


def watch_child(
    fitbox_pid: int, seen: dict[str, float], cpus: list[int], stop: threading.Event
) -> None:
    """Find fitbox's serving child and poll its /health every millisecond: the wall-clock
    moment it first answers 200 is when the child was really ready; ``cpus``: the CPUs
    fitbox pinned it to. (It once locked onto the
    engine probe's ``--port 0``, which never answers, so it never recorded a time.)"""
    port = None
    while port is None and not stop.is_set():
        for child in psutil.Process(fitbox_pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if port is None and (port := serving_port(child.cmdline())):
                    time.sleep(0.005)  # past setpriv and taskset's exec: the engine's own
                    cpus[:] = sorted(child.cpu_affinity() or [])
        time.sleep(0.001)
    while port is not None and not stop.is_set():
        if health_ok(port):
            seen["ready"] = time.time()
            return
        time.sleep(0.001)


class Cold(NamedTuple):
    """One cold call on a fresh fitbox, in seconds."""

    ready: float  # fitbox launched the child -> fitbox saw it ready
    lag: float | None  # fitbox's ready - the child's own first 200 on /health (1 ms watcher)
    # None: the watcher saw no 200 before the call ended; negative: fitbox saw it first
    whole: float  # the whole cold call, client side (load + 1 token)
    argv: list[str]  # the child's, from the store's children row
    cpus: list[int]  # the CPUs fitbox pinned the child to (empty: not seen)


def fitbox_ready(
    models: Path, model: str, env: dict[str, str] | None = None, chat: bool = False
) -> Cold:
    """One cold call on a fresh fitbox. ``chat``: a chat completion (the transformers child
    serves no /v1/completions)."""
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fitbox",
                "serve",
                "--port",
                "auto",
                "--home",
                str(home),
                "--models",
                str(models),
                "--log-level",
                "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )
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
            seen: dict[str, float] = {}
            cpus: list[int] = []
            stop = threading.Event()
            watcher = threading.Thread(target=watch_child, args=(proc.pid, seen, cpus, stop))
            watcher.start()
            started = time.perf_counter()
            body = {**BODY, "model": model}
            path = "/v1/completions"
            if chat:
                path, body = (
                    "/v1/chat/completions",
                    {
                        "model": model,
                        "max_tokens": 1,
                        "messages": [{"role": "user", "content": "Hi"}],
                    },
                )
            httpx.post(f"{url}{path}", json=body, timeout=600).raise_for_status()
            whole = time.perf_counter() - started
            stop.set()
            watcher.join()
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        with sqlite3.connect(home / "fitbox.sqlite3") as conn:
            start, ready = conn.execute(
                "SELECT load_start_at, load_ready_at FROM call_log ORDER BY id LIMIT 1"
            ).fetchone()
            (argv,) = conn.execute("SELECT argv FROM children ORDER BY id LIMIT 1").fetchone()
        lag = ready - seen["ready"] if "ready" in seen else None
        return Cold(ready - start, lag, whole, json.loads(argv), cpus)


def fitbox_ready_and_direct(
    root: Path, model: Path, rounds: int
) -> tuple[list[float], list[float]]:
    """(fitbox launch -> ready, direct llama-server's own with fitbox's argv), per round."""
    root.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        (root / model.name).symlink_to(model)
    seen, direct = [], []
    for _ in range(rounds):
        cold = fitbox_ready(root, model.stem)
        seen.append(cold.ready)
        direct.append(direct_ready(cold.argv))
    return seen, direct


def rss_bytes() -> int:
    return int(psutil.Process().memory_info().rss)


async def child_ready(argv: list[str], cpus: frozenset[int], log: Path) -> tuple[float, float]:
    """(seconds to spawn, seconds until it sees itself ready) of one Child; stopped at once."""
    port = free_port()
    argv = list(argv)
    argv[argv.index("--port") + 1] = str(port)
    child = Child(argv, port, log, cpus)
    started = time.perf_counter()
    await child.start()
    spawned = time.perf_counter() - started
    await child.wait_ready(120)
    took = time.perf_counter() - started
    await child.stop(0)
    return spawned, took


def spawn_ab(argv: list[str], rounds: int, heap_mb: int) -> dict[str, list[tuple[float, float]]]:
    """Launch -> ready of the same argv through the setpriv chain and through a fork."""
    ballast = bytearray(max(heap_mb * 2**20 - rss_bytes(), 0))
    ballast[::4096] = b"x" * len(ballast[::4096])  # touched: resident, as a real heap is
    cpus = frozenset(os.sched_getaffinity(0))
    chained = child_module.launch_argv
    seen: dict[str, list[tuple[float, float]]] = {
        "setpriv chain (vfork)": [],
        "preexec_fn (fork)": [],
    }

    async def run() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(rounds):
                for label in seen if i % 2 == 0 else reversed(list(seen)):
                    child_module.launch_argv = (
                        chained if label.startswith("setpriv") else lambda argv, cpus: None
                    )
                    seen[label].append(await child_ready(argv, cpus, Path(tmp) / "child.log"))
        child_module.launch_argv = chained

    asyncio.run(run())
    del ballast
    return seen


def tf_row(rounds: int) -> None:
    """The transformers child: fitbox's launch -> ready against the child launched directly
    with fitbox's argv and the engine's environment, interleaved."""
    from fitbox.engines.tf import _child_env

    sys.path.insert(0, str(REPO))
    from tests.support.tf_engine import smol_folder, tf_venv

    python = tf_venv()
    cache = Path(os.environ.get("FITBOX_TEST_CACHE", REPO / ".cache"))
    folder = smol_folder(python, pull("smollm2", cache / "models"))
    env = {"FITBOX_TF_PYTHON": str(python), "VIRTUAL_ENV": "", "CONDA_PREFIX": ""}
    direct, seen, whole = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / folder.name).symlink_to(folder)
        for _ in range(rounds):
            cold = fitbox_ready(root, folder.name, env, chat=True)
            child_env = _child_env() | {"CUDA_VISIBLE_DEVICES": ""}  # as launch() gives it
            direct.append(direct_ready(cold.argv, child_env))
            seen.append(cold.ready)
            whole.append(cold.whole)
    d, f, w = (statistics.median(x) * 1000 for x in (direct, seen, whole))
    print(
        f"load-to-ready, SmolLM2-135M float32 folder, transformers child on CPU "
        f"({rounds} rounds each, medians)"
    )
    print(f"  direct child, fitbox's argv, 1 ms polls          {d:8.1f} ms")
    print(
        f"  fitbox launch -> fitbox sees ready               {f:8.1f} ms   added {f - d:+6.1f} ms"
        f"   ratio {f / d:.3f}"
    )
    print(f"  fitbox cold chat call, client-side (load + 1 token) {w:8.1f} ms")
    deltas = [round((b - a) * 1000, 1) for a, b in zip(direct, seen, strict=True)]
    print(f"  per round, fitbox - direct (ms): {deltas}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tf-rounds", type=int, default=2)
    parser.add_argument("--spawn-rounds", type=int, default=10)
    parser.add_argument("--heap-mb", type=int, default=96)
    args = parser.parse_args()
    model = pull("smollm2", Path(os.environ.get("FITBOX_TEST_CACHE", REPO / ".cache")) / "models")
    direct: list[float] = []
    pinned: list[float] = []
    seen: list[float] = []
    lag: list[float] = []
    whole: list[float] = []
    for i in range(args.rounds):  # interleaved, so page cache and load are shared
        cold = fitbox_ready(model.parent, model.stem)
        argv = cold.argv
        alike = ["taskset", "-c", ",".join(map(str, cold.cpus)), *argv] if cold.cpus else argv
        for baseline, into in ((argv, direct), (alike, pinned))[:: 1 if i % 2 else -1]:
            into.append(direct_ready(baseline))
        seen.append(cold.ready)
        if cold.lag is not None:
            lag.append(cold.lag)
        whole.append(cold.whole)
    d, f, w = (statistics.median(x) * 1000 for x in (direct, seen, whole))
    p = statistics.median(pinned) * 1000
    print(f"load-to-ready, SmolLM2-135M Q4_1 on CPU ({args.rounds} rounds each, medians)")
    print(f"  direct llama-server, fitbox's argv, 1 ms polls   {d:8.1f} ms")
    print(
        f"  fitbox launch -> fitbox sees ready               {f:8.1f} ms   added {f - d:+6.1f} ms"
        f"   ratio {f / d:.3f}"
    )
    print(
        f"  direct, fitbox's argv and its pin (taskset)      {p:8.1f} ms   fitbox added "
        f"{f - p:+6.1f} ms   ratio {f / p:.3f}"
    )
    print(f"  fitbox cold call, client-side (load + 1 token)   {w:8.1f} ms")
    deltas = [round((b - a) * 1000, 1) for a, b in zip(direct, seen, strict=True)]
    print(f"  per round, fitbox - direct (ms): {deltas}")
    deltas = [round((b - a) * 1000, 1) for a, b in zip(pinned, seen, strict=True)]
    print(f"  per round, fitbox - direct pinned alike (ms): {deltas}")
    lags = sorted(x * 1000 for x in lag)
    spread = "none seen"
    if lags:
        spread = (
            f"median {statistics.median(lags):+.1f} ms, min {lags[0]:+.1f}, max {lags[-1]:+.1f}"
        )
    print(
        f"  fitbox's lag behind the child's own first 200 on /health (1 ms watcher, "
        f"{len(lags)} of {args.rounds} rounds seen; negative: fitbox saw it first): "
        f"{spread}"
    )
    if args.tf_rounds:
        tf_row(args.tf_rounds)
    if args.spawn_rounds:
        seen_by = spawn_ab(argv, args.spawn_rounds, args.heap_mb)
        print(
            f"one Child, {args.heap_mb} MB heap, {args.spawn_rounds} rounds interleaved: "
            "spawn (start() returned), launch -> ready, p50 / max ms (/ fork)"
        )
        forked = seen_by["preexec_fn (fork)"]
        base = [statistics.median(x[i] for x in forked) for i in (0, 1)]
        for label, values in seen_by.items():
            cols = []
            for i, name in ((0, "spawn"), (1, "ready")):
                p50, top = statistics.median(v[i] for v in values), max(v[i] for v in values)
                cols.append(f"{name} {p50 * 1000:7.1f} / {top * 1000:7.1f} ({p50 / base[i]:.3f})")
            print(f"  {label:<24}" + "   ".join(cols))
        if lags:  # the parts fitbox adds, each measured on its own, not as a difference
            spawn = statistics.median(v[0] for v in seen_by["setpriv chain (vfork)"]) * 1000
            own = spawn + max(statistics.median(lags), 0.0)
            print(
                f"fitbox's own part of launch -> ready, p50: spawn {spawn:.1f} ms + ready "
                f"seen {statistics.median(lags):+.1f} ms after the child's first 200 <= "
                f"{own:.1f} ms (direct's own spawn not taken off; target < 20 ms); the rest "
                "of a round's difference is the load's own spread"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
