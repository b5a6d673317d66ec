"""Settings that change a resident's launch take effect on its next load, without a manual
unload, and one turned off never comes back: real llama-server children.

The embeddings setting on SmolLM2's GGUF through a real fitbox and its settings API: turned
on, the next embeddings call is served (the idle resident was loaded again with
``--embeddings``); turned off, the resident is loaded again without it. And the restart a
thread change makes (a later claim takes cores of an idle engine, which starts again on
fewer: box/admit.py) launches it as its settings say then, not as it was recorded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fitbox import config as settings
from fitbox.box.box import Box
from fitbox.engines.kinds import EngineKinds
from fitbox.engines.llama_server import LlamaServer
from fitbox.models.catalog import Catalog
from fitbox.probe.gpus import open_gpu_probe
from fitbox.probe.host import physical_cores

from .support.ggufs import write_tiny_llama
from .support.processes import FitboxProcess, running_fitbox

SMOL = "SmolLM2-135M-Instruct.Q4_1"


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory, smollm2: Path) -> Iterator[FitboxProcess]:
    tmp = tmp_path_factory.mktemp("settings")
    root = tmp / "models"
    root.mkdir()
    (root / smollm2.name).symlink_to(smollm2)
    with running_fitbox(tmp / "home", [root]) as running:
        yield running


def resident(box: FitboxProcess) -> dict[str, object]:
    (found,) = httpx.get(f"{box.url}/v1/residents", timeout=30).json()["data"]
    assert found["model"] == SMOL and found["state"] == "ready"
    return dict(found)


def argv_of(pid: object) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def embeddings(box: FitboxProcess) -> httpx.Response:
    body = {"model": SMOL, "input": ["a cat", "tax law"]}
    return httpx.post(f"{box.url}/v1/embeddings", json=body, timeout=300)


def set_embeddings(box: FitboxProcess, on: bool) -> None:
    done = httpx.post(
        f"{box.url}/v1/settings/pair", json={"model": SMOL, "embeddings": on}, timeout=30
    )
    assert done.status_code == 200, done.text


def test_the_embeddings_setting_takes_effect_without_an_unload(box: FitboxProcess) -> None:
    chat = {"model": SMOL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    assert httpx.post(f"{box.url}/v1/chat/completions", json=chat, timeout=300).status_code == 200
    first = resident(box)
    assert "--embeddings" not in argv_of(first["pid"]) and first["embeddings"] is False
    refused = embeddings(box)  # off: refused before anything is loaded again
    assert refused.status_code == 400 and refused.json()["error"]["code"] == (
        "not_an_embeddings_model"
    )
    assert resident(box)["pid"] == first["pid"]

    set_embeddings(box, True)
    served = embeddings(box)  # the idle resident is loaded again as its setting says
    assert served.status_code == 200, served.text
    vectors = [d["embedding"] for d in served.json()["data"]]
    assert len(vectors) == 2 and len(vectors[0]) == 576 and vectors[0] != vectors[1]
    on = resident(box)
    assert on["pid"] != first["pid"] and "--embeddings" in argv_of(on["pid"])
    assert on["embeddings"] is True

    set_embeddings(box, False)
    assert httpx.post(f"{box.url}/v1/chat/completions", json=chat, timeout=300).status_code == 200
    off = resident(box)
    assert off["pid"] != on["pid"] and "--embeddings" not in argv_of(off["pid"])
    assert off["embeddings"] is False
    assert embeddings(box).status_code == 400
    log = box.log()
    assert "its embeddings setting was turned on" in log
    assert "its embeddings setting was turned off" in log


@pytest.mark.skipif(len(physical_cores()) < 2, reason="needs two physical cores")
def test_a_thread_change_restart_launches_as_the_settings_say_now(tmp_path: Path) -> None:
    """tiny-a loads with embeddings on; the setting is turned off; then it is started
    again on another number of threads (box/admit.py ``widen``, the relaunch a claim's
    change of cores makes): the successor runs without --embeddings, as its setting says
    now. No call joins it meanwhile (and no warmth loop runs), so nothing but that restart
    could have launched it so."""
    root = tmp_path / "models"
    root.mkdir()
    write_tiny_llama(root / "tiny-a.gguf", seed=1)
    config = settings.load(
        {"home": str(tmp_path / "home"), "models": str(root)}, env={"FITBOX_WAIT_TIMEOUT": "120"}
    )
    catalog = Catalog(config.models, config.aliases, config.facts_cache)

    async def run() -> None:
        box = Box(config, catalog, open_gpu_probe(""), None, [], EngineKinds([LlamaServer()]))
        try:
            await box.update_settings("pair", "tiny-a", {"embeddings": True})
            lease = await box.acquire("tiny-a")
            first = lease.resident
            lease.release()
            assert first.child is not None and "--embeddings" in first.child.argv
            await box.update_settings("pair", "tiny-a", {"embeddings": False})
            every = tuple(sorted(box.physical_cores()))
            cores = every[:1] if first.threads > 1 else every  # another thread count
            async with box.registry.lock:
                box.admission.widen(first, cores)
            successor = box.registry.get(first.key)
            while successor is first or successor is None:  # swapped in by the relaunch
                changed = box.registry.change()
                await changed.wait()
                successor = box.registry.get(first.key)
            await asyncio.shield(successor.ready)
            assert successor.threads == len(cores) != first.threads
            assert successor.child is not None and "--embeddings" not in successor.child.argv
            assert successor.embeddings is False
        finally:
            await box.close()

    asyncio.run(run())
