"""Regenerate the load logs of the tiny GGUF zoo (tests/support/gguf_zoo.py) next to this file.

Run from the repository root: ``.venv/bin/python tests/data/load_logs/regenerate_zoo.py``.
For each zoo model, two runs of the real llama-server with ``-lv 4 --fit off -ngl 0``:
``-c 2048 -np 1`` (f16 cache) and ``-c 4096 -np 2 -ctk q8_0 -ctv q8_0 -fa on`` (every zoo
model has head dim 32, so q8_0 blocks fit). Each waits for ``GET /health`` 200, sends one
``/v1/completions`` (so a graph really runs), then SIGTERM so the shutdown memory breakdown
is printed; stdout and stderr are captured together into ``<model>-c<ctx>-np<np>-<ctk>.log``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))

from fitbox.engines.child import free_port  # noqa: E402
from fitbox.engines.llama_server import find_binary  # noqa: E402
from tests.support.gguf_zoo import WRITERS  # noqa: E402

COMMON = ["-lv", "4", "--fit", "off", "-ngl", "0", "--no-webui"]
SETTINGS: dict[str, list[str]] = {
    "c2048-np1-f16": ["-c", "2048", "-np", "1"],
    "c4096-np2-q8_0": ["-c", "4096", "-np", "2", "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on"],
}


def run(model: Path, extra: list[str], out: Path) -> bool:
    port = free_port()
    argv = [str(find_binary().path), "-m", str(model), *COMMON, "--port", str(port), *extra]
    with out.open("wb") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    ok = False
    try:
        with httpx.Client(timeout=30) as client:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and proc.poll() is None:
                with contextlib.suppress(httpx.TransportError):
                    if client.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                        body = {"prompt": "hello", "max_tokens": 4}
                        reply = client.post(f"http://127.0.0.1:{port}/v1/completions", json=body)
                        ok = reply.status_code == 200
                        break
                time.sleep(0.1)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return ok


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for name, writer in WRITERS.items():
            model = writer(Path(tmp) / f"{name}.gguf")
            for setting, extra in SETTINGS.items():
                ok = run(model, extra, HERE / f"{name}-{setting}.log")
                print(name, setting, "ok" if ok else "FAILED")


if __name__ == "__main__":
    main()
