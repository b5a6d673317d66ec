"""Pinning (or loading) a model that is ready answers at once, also while every call slot of
it is busy: it needs no slot. The slot is held by a call on an engine the test stopped
(SIGSTOP), so it stays busy however fast the machine is."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from .support.ggufs import write_tiny_llama
from .support.holds import HOLD_IDLE_TIMEOUT, Background, calls_on, engine_stopped, until
from .support.processes import running_fitbox

pytestmark = pytest.mark.engine


def test_pin_on_a_busy_resident_does_not_wait_for_a_free_slot(
    tmp_path: Path, llama_server_bin: Path
) -> None:
    models = tmp_path / "models"
    models.mkdir()
    write_tiny_llama(models / "tiny.gguf")
    env = {"FITBOX_PARALLEL": "1", **HOLD_IDLE_TIMEOUT}
    with running_fitbox(tmp_path / "home", [models], env=env) as box:
        operator = f"{box.url}/v1/operator"
        assert httpx.post(f"{operator}/load", json={"model": "tiny"}, timeout=120).is_success
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        with engine_stopped(box, "tiny"):
            held = Background(
                lambda: httpx.post(f"{box.url}/v1/chat/completions", json=body, timeout=300)
            )
            until(lambda: calls_on(box, "tiny") == 1, "the call holding tiny's one slot")
            # the bound is a failure bound: a pin that queued for the slot never returns
            # while the engine is stopped
            for action in ("pin", "load"):
                done = httpx.post(f"{operator}/{action}", json={"model": "tiny"}, timeout=60)
                assert done.status_code == 200, done.text
            assert done.json()["resident"]["pinned"] is True
            assert calls_on(box, "tiny") == 1  # the held call is still on its slot
        assert held.result().status_code == 200
