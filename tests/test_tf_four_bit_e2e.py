"""``@4bit`` on a box without a GPU: bitsandbytes, which comes with the engine's extra,
quantizes a transformers folder on the CPU as it loads. A real fitbox, a real child in the
engine venv the installer's code built, SmolLM2's float32 folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from .support.processes import running_fitbox
from .support.tf_engine import engine_env

pytestmark = pytest.mark.engine
SMOL = "SmolLM2-135M-Instruct-f32"
HELLO = [{"role": "user", "content": "What is the capital of France?"}]


def resident(url: str) -> dict[str, Any]:
    (found,) = httpx.get(f"{url}/v1/residents", timeout=30).json()["data"]
    return dict(found)


def rss(pid: int) -> int:
    """The child's resident set now (bytes), read from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def test_at_4bit_loads_quantized_in_ram_and_answers(
    tmp_path: Path, tf_python: Path, smol_tf: Path
) -> None:
    root = tmp_path / "models"
    root.mkdir()
    (root / smol_tf.name).symlink_to(smol_tf)
    with running_fitbox(tmp_path / "home", [root], env=engine_env(tf_python, tmp_path)) as box:
        body = {"messages": HELLO, "max_tokens": 8, "temperature": 0}
        quantized = httpx.post(
            f"{box.url}/v1/chat/completions", json={"model": f"{SMOL}@4bit", **body}, timeout=600
        )
        assert quantized.status_code == 200, quantized.text
        assert quantized.json()["choices"][0]["message"]["content"]
        four = resident(box.url)
        assert (four["rung"], four["device"]) == ("4bit", "host")
        argv = Path(f"/proc/{four['pid']}/cmdline").read_bytes().split(b"\0")
        assert b"--load-in-4bit" in argv and argv[argv.index(b"--device") + 1] == b"cpu"
        four_rss = rss(four["pid"])
        # an unpinned call would join it (it serves the name): unloaded, it loads whole
        unloaded = httpx.post(f"{box.url}/v1/operator/unload", json={"model": SMOL}, timeout=60)
        assert unloaded.status_code == 200, unloaded.text
        whole = httpx.post(
            f"{box.url}/v1/chat/completions", json={"model": SMOL, **body}, timeout=600
        )
        assert whole.status_code == 200, whole.text
        full = resident(box.url)
        assert full["rung"] == "ram-only" and full["pid"] != four["pid"]
        assert full["basis"] == four["basis"] == "measured"  # counted by each child
        assert four["footprint"]["weights"] < full["footprint"]["weights"]
        print(  # the figures for the record, not a bound
            f"4bit: weights {four['footprint']['weights']} B, rss {four_rss} B; whole: "
            f"weights {full['footprint']['weights']} B, rss {rss(full['pid'])} B"
        )
