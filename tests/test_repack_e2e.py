"""--no-repack as a placement flag, end to end: with room for the repacked copy fitbox
loads the model repacked (faster); with RAM for the file alone it loads it with
--no-repack, says so in the plan, and the engine's measured weights follow the flag."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from fitbox.core import sizing
from fitbox.models.gguf_facts import read_facts

from .support.ggufs import write_tiny_llama
from .support.processes import running_fitbox
from .support.quants import quantize, repacking_cpu

pytestmark = pytest.mark.engine
MIB = 1 << 20


def chat(url: str) -> httpx.Response:
    body = {"model": "q4", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return httpx.post(f"{url}/v1/chat/completions", timeout=60, json=body)


def test_ram_for_the_file_alone_loads_it_with_no_repack(
    tmp_path: Path, llama_server_bin: Path
) -> None:
    cpu = repacking_cpu(llama_server_bin)
    models = tmp_path / "models"
    models.mkdir()
    source = write_tiny_llama(
        tmp_path / "f32.gguf", n_embd=512, n_head=8, n_ff=1536, n_ctx=512, extra_vocab=8000
    )  # a window of 512 only
    path = quantize(source, models / "q4.gguf", "Q4_0")
    shape = read_facts(path).shape
    packed, plain = sizing.footprint(shape, 512, 1, cpu=cpu), sizing.footprint(shape, 512, 1)
    assert packed.weights - plain.weights > 2 * MIB  # the copy is worth deciding about
    for cap, repack in ((packed.total + 8 * MIB, "on"), (plain.total + MIB, "ram_bound")):
        with running_fitbox(tmp_path / f"home-{repack}", [models], "--ram-max", str(cap)) as box:
            plan = httpx.get(f"{box.url}/v1/plan", params={"model": "q4"}).json()
            assert (plan["decision"], plan["repack"]) == ("place", repack), plan
            assert plan["no_repack"] is (repack == "ram_bound")
            assert chat(box.url).status_code == 200
            (resident,) = httpx.get(f"{box.url}/v1/residents").json()["data"]
            argv = Path(f"/proc/{resident['pid']}/cmdline").read_bytes().split(b"\0")
            assert (b"--no-repack" in argv) is (repack == "ram_bound")
            after = httpx.get(f"{box.url}/v1/plan", params={"model": "q4"}).json()
            assert after["basis"] == "measured" and after["repack"] == repack
            measured = after["devices"][0]["weights_bytes"]
            expected = (packed if repack == "on" else plain).weights
            assert abs(measured - expected) <= 0.02 * MIB  # the estimate followed the flag
