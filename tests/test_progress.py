"""server/inference/progress.py in process, without an engine: which streamed calls get their 200
before the load, and the queue position a waiting call sees (tests/test_box_inprocess.py
has the helpers)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from fitbox.box.box import Box
from fitbox.box.serving import Order
from fitbox.errors import EngineFailed
from fitbox.server.inference.progress import progress_of
from fitbox.store.db import Store

from .support.boxes import S, make_box, queued, resident_of
from .support.ggufs import write_tiny_llama

CHAT = "/v1/chat/completions"


def must_load(box: Box, name: str) -> bool:
    """Whether a streamed chat on ``name`` gets its 200 before its model loads, as the box
    opens it (box/serving.py)."""
    body = {"model": name, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    return box.serving.open(Order(CHAT, body, b"{}", "req")).waits


@pytest.fixture
def models(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    root.mkdir()
    write_tiny_llama(root / "tiny-a.gguf")
    return root


def test_a_stream_gets_its_200_first_only_when_its_model_must_load(
    tmp_path: Path, models: Path
) -> None:
    async def run() -> None:
        store = Store(tmp_path / "store.sqlite3")  # an opened call has its row
        try:
            box = make_box(tmp_path, models, store)
            assert must_load(box, "tiny-a")  # nothing resident
            assert not must_load(box, "no-such-model")  # its 404 is a status, not an event
            loading = resident_of(box, "tiny-a", S.STARTING)
            assert must_load(box, "tiny-a")
            box.registry.move(loading, S.READY)
            assert not must_load(box, "tiny-a")
        finally:
            store.close()

    asyncio.run(run())


def test_waiting_calls_see_their_place_and_a_loading_one_its_bytes(
    tmp_path: Path, models: Path
) -> None:
    async def run() -> None:
        store = Store(tmp_path / "store.sqlite3")
        try:
            box = make_box(tmp_path, models, store)
            leaving = resident_of(box, "tiny-a", S.STOPPING)  # until the test moves it
            first, second = (box.calls.open(CHAT, "tiny-a", True, rid) for rid in "ab")
            waits = [asyncio.ensure_future(c.place(1, 0, 0)) for c in (first, second)]
            for _ in range(2):  # one enters, then the other (each at its next yields)
                await queued(box)
                await asyncio.sleep(0)
            assert len(box.queue()) == 2
            now = time.time()
            seen = [progress_of(box, c, now) for c in (first, second)]
            assert [(p["state"], p["queue_position"]) for p in seen] == [
                ("queued", 1),
                ("queued", 2),
            ]
            box.registry.move(leaving, S.STOPPED)  # the event this test controls
            for wait in waits:  # placed now, on a box without an engine: failed, as data
                with pytest.raises(EngineFailed):
                    await wait
        finally:
            store.close()
        box = make_box(tmp_path, models)
        loading = resident_of(box, "tiny-a", S.STARTING)
        call_like = first  # only its model and id are read
        found = progress_of(box, call_like, time.time() - 2)
        assert found["state"] == "loading" and found["queue_position"] is None
        assert found["bytes_total"] == loading.artifact.facts.shape.weights_bytes
        assert found["bytes_loaded"] == 0 and found["seconds"] >= 2  # no child: nothing in

    asyncio.run(run())
