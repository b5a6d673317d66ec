"""box/ in one process, without an engine: the registry's transitions, admission (join,
wait, the waiting room, room freed), and the call object's row.

Residents here are registered by the test itself, as admission would register them; no
child is launched, so nothing depends on an engine's speed. Waits are bounded by events
the test sets (a resident leaving), or by a deadline nothing in the test can move.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fitbox.box.residents import TRANSITIONS, IllegalTransition, Registry
from fitbox.errors import EngineFailed, ModelBusy, ModelNotFound
from fitbox.store.db import Store

from .support.boxes import S, make_box, queued, resident_of
from .support.ggufs import write_tiny_llama


@pytest.fixture
def models(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    root.mkdir()
    write_tiny_llama(root / "tiny-a.gguf", seed=1)
    write_tiny_llama(root / "tiny-b.gguf", seed=2)
    return root


# -- the registry ------------------------------------------------------------------------


def test_every_state_change_follows_the_table_and_an_illegal_one_raises(
    tmp_path: Path, models: Path
) -> None:
    async def run() -> None:
        box = make_box(tmp_path, models)
        registry = box.registry
        first = resident_of(box, "tiny-a", S.STARTING)
        assert first.state is S.STARTING and first.key in registry
        with pytest.raises(IllegalTransition, match="starting -> stopped"):
            registry.move(first, S.STOPPED)
        registry.move(first, S.READY)
        with pytest.raises(IllegalTransition, match="ready -> starting"):
            registry.move(first, S.STARTING)
        registry.move(first, S.STOPPING)
        with pytest.raises(IllegalTransition, match="stopping -> ready"):
            registry.move(first, S.READY)
        changed = registry.change()
        registry.move(first, S.STOPPED)
        assert changed.is_set()  # whoever waited for room is woken
        assert first.key not in registry and len(registry) == 0
        with pytest.raises(IllegalTransition):
            registry.move(first, S.STOPPING)  # stopped is the end
        failed = resident_of(box, "tiny-b", S.STARTING)
        registry.move(failed, S.FAILED)
        assert failed.key not in registry and TRANSITIONS[S.FAILED] == frozenset()
        with pytest.raises(AttributeError):
            failed.state = S.READY  # type: ignore[misc]  # read-only: the registry writes it

    asyncio.run(run())


def test_the_registry_refuses_a_second_resident_for_one_file(tmp_path: Path, models: Path) -> None:
    async def run() -> None:
        box = make_box(tmp_path, models)
        resident_of(box, "tiny-a")
        with pytest.raises(IllegalTransition, match="already resident"):
            resident_of(box, "tiny-a")
        assert isinstance(box.registry, Registry) and len(box.registry) == 1

    asyncio.run(run())


# -- admission -----------------------------------------------------------------------------


def test_a_call_joins_a_ready_resident_and_its_release_makes_it_idle(
    tmp_path: Path, models: Path
) -> None:
    async def run() -> None:
        box = make_box(tmp_path, models)
        resident = resident_of(box, "tiny-a")
        lease = await box.acquire("tiny-a")
        again = await box.acquire("tiny-a")
        assert lease.resident is resident and again.resident is resident
        assert resident.calls == 2 and resident.served == 2 and not lease.loaded
        lease.release()
        lease.release()  # twice is harmless
        again.release()
        assert resident.calls == 0

    asyncio.run(run())


def test_a_call_beyond_the_free_slots_waits_at_the_door_until_a_slot_is_released(
    tmp_path: Path, models: Path
) -> None:
    """Two slots: two calls hold them; a third (and one asking for both slots) waits in
    fitbox's queue, not in the engine's, and each gets in when enough slots come back."""

    async def run() -> None:
        box = make_box(tmp_path, models)
        resident = resident_of(box, "tiny-a")
        first, second = await box.acquire("tiny-a"), await box.acquire("tiny-a")
        third = asyncio.ensure_future(box.acquire("tiny-a", call_id=3))
        (waiting,) = await queued(box)
        assert waiting["call_id"] == 3 and waiting["blocked_by"] == ["tiny-a"]
        assert resident.slots_taken == 2 and not third.done()
        first.release()
        got = await third
        assert got.resident is resident and resident.slots_taken == 2 and box.queue() == []
        both = asyncio.ensure_future(box.acquire("tiny-a", call_id=4, slots=2))
        await queued(box)
        second.release()  # one slot free: not enough for n=2
        for _ in range(100):  # the woken waiter decides again (no I/O: only these steps)
            await asyncio.sleep(0)
        assert not both.done() and [w["call_id"] for w in await queued(box)] == [4]
        got.release()
        pair = await both
        assert pair.slots == 2 and resident.slots_taken == 2
        pair.release()
        assert resident.slots_taken == 0 and resident.calls == 0

    asyncio.run(run())


def test_a_call_to_a_leaving_model_waits_in_the_queue_then_gets_model_busy(
    tmp_path: Path, models: Path
) -> None:
    async def run() -> None:
        box = make_box(tmp_path, models, FITBOX_WAIT_TIMEOUT="0.3")
        resident_of(box, "tiny-a", S.STOPPING)  # nothing in this test will stop it
        call = asyncio.ensure_future(box.acquire("tiny-a", call_id=7))
        (waiting,) = await queued(box)
        assert waiting["model"] == "tiny-a" and waiting["call_id"] == 7
        assert waiting["blocked_by"] == ["tiny-a"]
        with pytest.raises(ModelBusy) as busy:
            await call
        assert busy.value.detail["blockers"] == ["tiny-a"] and box.queue() == []

    asyncio.run(run())


def test_a_waiting_call_goes_when_the_blocker_leaves_and_an_engine_missing_is_data(
    tmp_path: Path, models: Path
) -> None:
    async def run() -> None:
        box = make_box(tmp_path, models)
        leaving = resident_of(box, "tiny-a", S.STOPPING)
        call = asyncio.ensure_future(box.acquire("tiny-a"))
        await queued(box)
        box.registry.move(leaving, S.STOPPED)  # the event this test controls
        with pytest.raises(EngineFailed) as failed:
            await call
        assert "pip install 'fitbox[llama]'" in failed.value.message
        assert len(box.registry) == 0 and box.queue() == []
        assert box.crashes.failed(leaving.key) is None  # no engine is not the model's crash
        assert box.supervisor.restart_delay(leaving.artifact) == 0

    asyncio.run(run())


def test_a_waiting_call_cancelled_as_the_one_before_it_leaves_ends_at_once(
    tmp_path: Path, models: Path
) -> None:
    """The first of two waiting calls leaves (its client went) and wakes the second; the
    second's client goes too, in the same few turns of the loop. On Python 3.11 a
    ``wait_for`` whose inner wait has just finished swallows that cancel, and the call would
    wait out its whole ``max_wait``. Every interleaving of the two cancels is tried."""

    async def run(turns: int) -> None:
        box = make_box(tmp_path, models)  # max_wait 30 s: far past the bound below
        resident_of(box, "tiny-a", S.STOPPING)  # nothing in this test will stop it
        first = asyncio.ensure_future(box.acquire("tiny-a", call_id=1))
        second = asyncio.ensure_future(box.acquire("tiny-a", call_id=2))
        while len(box.queue()) < 2:
            await queued(box)
            await asyncio.sleep(0)
        first.cancel()
        for _ in range(turns):
            await asyncio.sleep(0)
        second.cancel()
        done, _ = await asyncio.wait({first, second}, timeout=5)
        assert done == {first, second}, f"a cancelled call kept waiting ({turns} turns)"
        assert second.cancelled() and box.queue() == []
        await box.close()

    for turns in range(10):
        asyncio.run(run(turns))


# -- the call object --------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store(tmp_path / "calls.sqlite3")
    yield opened
    opened.close()


def rows(store: Store) -> list[dict[str, Any]]:
    store.flush()
    with sqlite3.connect(store.path) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute("SELECT * FROM call_log ORDER BY id")]


def test_a_call_owns_its_row_from_start_to_its_measured_speed(
    tmp_path: Path, models: Path, store: Store
) -> None:
    body = (
        b'{"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 5}, '
        b'"timings": {"prompt_n": 11, "prompt_ms": 5.5, "prompt_per_token_ms": 0.5, '
        b'"predicted_n": 5, "predicted_ms": 10.0, "predicted_per_token_ms": 2.0, '
        b'"cache_n": 0}}'
    )

    async def run() -> None:
        box = make_box(tmp_path, models, store)
        resident = resident_of(box, "tiny-a")
        call = box.calls.open("/v1/chat/completions", "tiny-a", False, "req-1")
        assert rows(store)[-1]["outcome"] == "pending"
        placed = await call.place(need=20, max_tokens=5, prompt_tokens=15)
        assert placed is resident and resident.calls == 1
        call.answered(200, body)
        assert call.lease is not None
        call.lease.release()  # what call.read() does once the body is read
        row = rows(store)[-1]
        assert (row["outcome"], row["prompt_tokens"], row["completion_tokens"]) == ("ok", 11, 5)
        assert row["decode_per_token_ms"] == 2.0 and row["rung"] == resident.rung.value
        assert box.speeds.of(resident.artifact, resident.rung.value).decode_ms == 2.0
        assert resident.calls == 0

    asyncio.run(run())


def test_a_call_that_fails_or_is_cut_off_records_it_and_releases_its_lease(
    tmp_path: Path, models: Path, store: Store
) -> None:
    async def run() -> None:
        box = make_box(tmp_path, models, store)
        resident = resident_of(box, "tiny-a")
        refused = box.calls.open("/v1/chat/completions", "nope", False, "r1")
        with pytest.raises(ModelNotFound) as missing:
            await refused.place(need=1, max_tokens=0, prompt_tokens=0)
        refused.failed(missing.value)
        cut = box.calls.open("/v1/chat/completions", "tiny-a", True, "r2")
        await cut.place(need=1, max_tokens=0, prompt_tokens=0)
        assert resident.calls == 1
        cut.interrupted()
        cut.interrupted()  # a second end releases nothing more
        assert resident.calls == 0
        first, second = rows(store)[-2:]
        assert (first["outcome"], first["error_code"], first["http_status"]) == (
            "error",
            "model_not_found",
            404,
        )
        assert second["outcome"] == "interrupted" and second["artifact"] is not None

    asyncio.run(run())


def test_a_watched_wait_that_ends_as_its_call_is_cancelled_leaves_no_unread_exception(
    tmp_path: Path, models: Path
) -> None:
    """A stream's last ``anext()`` ends (StopAsyncIteration) in the same turn the client's
    disconnect cancels the call: asyncio never reports "Task exception was never retrieved".
    The wait runs in the call's own task (no inner task is left holding the ending), so the
    call ends with either the cancel or the ending, and its awaiter reads it. The turns are
    asyncio's own, in order."""

    async def run() -> list[dict[str, Any]]:
        box = make_box(tmp_path, models)
        resident = resident_of(box, "tiny-a")
        reported: list[dict[str, Any]] = []
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: reported.append(ctx))

        async def last_piece() -> bytes:
            raise StopAsyncIteration

        call = asyncio.ensure_future(box.watchdog.watched(resident, last_piece()))
        await asyncio.sleep(0)  # the call starts its wait
        await asyncio.sleep(0)  # the wait ends with StopAsyncIteration
        call.cancel()  # ... and the disconnect lands in the same turns
        with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
            await call
        del call
        gc.collect()  # asyncio reports an unread task exception when the task is freed
        return reported

    reported = asyncio.run(run())
    assert [ctx["message"] for ctx in reported] == []
