"""One budget for every kind of model: a chat model (SmolLM2, GGUF, llama-server) and a
speech model (the piper voice, the task child) under a RAM cap that holds one of them at a
time. Two clients call them at once, round after round: every call is answered, each model
evicts the other by the bytes it holds (recorded with its reason), and no model is stopped
while a call is on it."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from fitbox.core import sizing
from fitbox.models.gguf_facts import read_facts
from fitbox.models.task_models import PIPER, task_facts

from .support.processes import running_fitbox
from .support.task_engines import VOICE, engine_dir, piper_voice

pytestmark = pytest.mark.engine
SMOL = "SmolLM2-135M-Instruct.Q4_1"
ROUNDS = 3


def one_at_a_time(smollm2: Path, voice: Path) -> int:
    """A RAM cap that holds either model alone (SmolLM2 at a 512 window; the voice as
    priced before its first load, which measures it a little smaller) and never both."""
    chat = sizing.footprint(read_facts(smollm2).shape, 512, 1).total
    speech = task_facts(voice, PIPER).shape.weights_bytes
    return speech + chat // 2


def test_chat_and_speech_evict_each_other_and_never_a_serving_one(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    root = tmp_path / "models"
    root.mkdir()
    voice = piper_voice()
    (root / smollm2.name).symlink_to(smollm2)
    (root / "joe").symlink_to(voice.parent)
    env = {"FITBOX_ENGINE_DIR": str(engine_dir(tmp_path / "engines"))}
    cap = str(one_at_a_time(smollm2, voice))
    with running_fitbox(tmp_path / "home", [root], "--ram-max", cap, env=env) as box:
        together = threading.Barrier(2)
        answers: dict[str, list[int]] = {"chat": [], "speech": []}

        def client(kind: str) -> None:
            with httpx.Client(base_url=box.url, timeout=600) as http:
                for _ in range(ROUNDS):
                    together.wait()  # both calls of a round leave at once
                    if kind == "chat":
                        reply = http.post("/v1/chat/completions", json=CHAT)
                    else:
                        reply = http.post("/v1/audio/speech", json=SPEECH)
                        assert reply.content[:4] == b"RIFF"
                    answers[kind].append(reply.status_code)

        threads = [threading.Thread(target=client, args=(k,)) for k in answers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert answers == {"chat": [200] * ROUNDS, "speech": [200] * ROUNDS}
        calls = box.calls()
        assert [c["outcome"] for c in calls] == ["ok"] * 2 * ROUNDS
        evictions = _rows(box.url, "evictions")
    assert len(evictions) >= ROUNDS - 1  # each round's second model needs the other's room
    for eviction in evictions:
        assert eviction["reason"] == "make_room"
        assert {eviction["model"], eviction["for_model"]} == {SMOL, VOICE}
        on_it = [c for c in calls if c["model_asked"] == eviction["model"]]
        serving = [c for c in on_it if c["admitted_at"] <= eviction["at"] <= c["last_byte_at"]]
        assert serving == [], f"{eviction['model']} was stopped while serving {serving}"
    assert all(json.loads(c["devices"] or "{}") for c in calls)  # each placed somewhere


CHAT = {"model": SMOL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
SPEECH = {"model": VOICE, "voice": "joe", "input": "One budget.", "response_format": "wav"}


def _rows(url: str, table: str) -> list[dict[str, Any]]:
    found = httpx.get(f"{url}/v1/telemetry", params={"table": table}, timeout=30).json()
    rows: list[dict[str, Any]] = found["rows"]
    return rows
