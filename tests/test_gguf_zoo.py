"""Every tiny GGUF in the zoo loads in the real llama-server and answers one completion."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from fitbox.engines.child import free_port
from fitbox.engines.llama_server import find_binary

from .support.gguf_zoo import WRITERS

pytestmark = pytest.mark.engine

HEALTH_TIMEOUT_S = 60.0
# What each model's load log must show: the cache the feature makes llama.cpp build.
EXPECTED: dict[str, list[str]] = {
    "gqa-per-layer": ["n_head_kv             = [4, 2, 1, 0]", "llama_kv_cache: size ="],
    "swa": ["creating non-SWA KV cache, size = 2048 cells", "creating     SWA KV cache"],
    "moe": ["n_expert              = 8", "n_expert_used         = 2"],
    "hybrid": ["llama_memory_recurrent: size =", "llama_kv_cache: size ="],
    "mamba2-hybrid": ["llama_memory_recurrent: size =", "llama_kv_cache: size ="],
}


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_zoo_model_loads_and_completes(name: str, tmp_path: Path) -> None:
    model = WRITERS[name](tmp_path / f"{name}.gguf")
    assert model.stat().st_size < 8 * 2**20
    port = free_port()
    argv = [str(find_binary().path), "-m", str(model), "--host", "127.0.0.1", "--port", str(port)]
    argv += ["-c", "2048", "-np", "1", "-ngl", "0", "--fit", "off", "-lv", "4", "--no-webui"]
    log_path = tmp_path / "server.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(timeout=30) as client:
            deadline = time.monotonic() + HEALTH_TIMEOUT_S
            while True:
                assert proc.poll() is None, f"llama-server exited:\n{log_path.read_text()}"
                assert time.monotonic() < deadline, f"no /health 200:\n{log_path.read_text()}"
                with contextlib.suppress(httpx.TransportError):
                    if client.get(f"{url}/health").status_code == 200:
                        break
                time.sleep(0.1)
            reply = client.post(f"{url}/v1/completions", json={"prompt": "hello", "max_tokens": 4})
            assert reply.status_code == 200, reply.text
            assert reply.json()["usage"]["completion_tokens"] >= 1
    finally:
        _stop(proc)
    text = log_path.read_text(errors="replace")
    for needle in EXPECTED[name]:
        assert needle in text, f"{needle!r} not in the load log:\n{text}"
