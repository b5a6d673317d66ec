"""A 503 model_busy says when to come back: Retry-After from the blockers' expected idle
time (their calls' measured ends), or the wait the call had when that is unknown. In one
process, without an engine (see test_box_inprocess.py for the helpers)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from fitbox.errors import DoesNotFit, ModelBusy
from fitbox.server.door.errors import error_response

from .support.boxes import S, make_box, queued, resident_of
from .support.ggufs import write_tiny_llama


@pytest.fixture
def models(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    root.mkdir()
    write_tiny_llama(root / "tiny-a.gguf")
    return root


def busy_after(tmp_path: Path, models: Path, end: float | None) -> float | None:
    """The retry_after of a call to a model that is leaving while one call of its, expected
    to end at monotonic ``end`` (None: unmeasured), is still on it."""

    async def run() -> float | None:
        box = make_box(tmp_path, models, FITBOX_WAIT_TIMEOUT="0.3")
        leaving = resident_of(box, "tiny-a", S.STOPPING)  # nothing in this test stops it
        leaving.expected_ends[1] = end
        call = asyncio.ensure_future(box.acquire("tiny-a"))
        await queued(box)
        with pytest.raises(ModelBusy) as busy:
            await call
        return busy.value.retry_after

    return asyncio.run(run())


def test_model_busy_retries_after_the_blockers_measured_end(tmp_path: Path, models: Path) -> None:
    started = time.monotonic()
    retry_after = busy_after(tmp_path, models, started + 1000)
    elapsed = time.monotonic() - started
    assert retry_after is not None and 1000 - elapsed <= retry_after <= 1000


def test_model_busy_retries_after_the_wait_it_had_when_the_end_is_unmeasured(
    tmp_path: Path, models: Path
) -> None:
    assert busy_after(tmp_path, models, None) == pytest.approx(0.3)


@pytest.mark.parametrize(("seconds", "header"), [(41.2, "42"), (0.0, "1"), (0.3, "1")])
def test_retry_after_is_whole_seconds_and_at_least_one(seconds: float, header: str) -> None:
    response = error_response(ModelBusy("busy", retry_after=seconds))
    assert response.headers["retry-after"] == header
    assert response.headers["x-should-retry"] == "true"
    assert b"retry_after" not in bytes(response.body)  # a header, not a body field


def test_an_error_a_retry_cannot_help_has_no_retry_after() -> None:
    response = error_response(DoesNotFit("too big", retry_after=5))
    assert "retry-after" not in response.headers
