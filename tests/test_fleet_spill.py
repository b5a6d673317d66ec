"""A spill that compares predicted waits: a call whose model's resident boxes have every
slot taken goes to a box that places the model without evicting when that box's load (and
its queue) is sooner than the wait for a slot (the busy box's queue ETA, from its long-poll
answer); otherwise it queues where the model is. Unknown figures spill, as before. Pure
parts (the box's slot wait, the central's decision) and the central's candidates in
process, the boxes' plans answered by a mock transport."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from fitbox.box.waiting import slot_wait
from fitbox.central import routing, spill
from fitbox.central.mirror import BoxLink, Fleet
from fitbox.central.store import BoxRecord, CentralStore

from .support.boxes import make_box, resident_of
from .support.ggufs import write_tiny_llama


def test_a_slot_wait_is_the_first_slot_that_frees_after_those_ahead() -> None:
    assert slot_wait([], 2, []) == 0.0  # a slot free
    assert slot_wait([5.0], 1, []) == 0.0
    assert slot_wait([5.0, 9.0], 0, []) == 5.0  # the first of its calls to end
    assert slot_wait([5.0, 9.0], 0, [4.0]) == 9.0  # one ahead takes the slot at 5, till 9
    assert slot_wait([5.0, 9.0], 0, [1.0, 1.0]) == 7.0  # 5 → 6 → 7
    assert slot_wait([5.0], 1, [2.0]) == 2.0  # the free slot goes to the one ahead
    assert slot_wait([None, 9.0], 0, []) is None  # a call not measured
    assert slot_wait([5.0], 0, [None]) is None


def test_a_box_says_each_ready_resident_s_slot_wait(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    write_tiny_llama(models / "tiny.gguf")

    async def run() -> dict[str, float | None]:
        box = make_box(tmp_path, models)
        resident = resident_of(box, "tiny")  # two slots
        assert box.queue_etas() == {"tiny": 0.0}
        resident.calls = resident.slots_taken = 2
        resident.expected_ends = {1: time.monotonic() - 1, 2: time.monotonic() + 8}
        assert box.queue_etas() == {"tiny": None}  # one overdue: its end is not known
        resident.expected_ends = {1: time.monotonic() + 20, 2: time.monotonic() + 8}
        return box.queue_etas()

    (wait,) = asyncio.run(run()).values()
    assert wait is not None and 7 <= wait <= 8


def _link(box_id: str, model: str | None = None, **said: Any) -> BoxLink:
    record = BoxRecord(box_id, box_id, "0.1", f"http://{box_id}.test:8484", "k", 0.0, None, None)
    link = BoxLink(record, state="up")
    link.models = [{"id": "m", "resident": model is not None}]
    if model is not None:
        link.residents = [{"model": model, "parallel": 1}]
        link.in_flight = 1  # its one slot taken
    link.heard({"waiting": 0, **said})
    return link


def test_the_central_spills_when_the_wait_is_longer_than_a_load_elsewhere() -> None:
    busy, other = _link("busy", "m", queue_eta={"m": 30.0}), _link("other")
    weighed, order = spill.decide([(busy, "m")], [(other, "m", {"predicted_seconds": 3.0})])
    assert weighed.taken and order == [other]
    assert weighed.header() == "from=busy; wait=30.0; to=other; wait=3.0; load=3.0; taken"
    busy.heard({"queue_eta": {"m": 2.0}})
    weighed, _ = spill.decide([(busy, "m")], [(other, "m", {"predicted_seconds": 3.0})])
    assert not weighed.taken and weighed.header().endswith("wait=3.0; load=3.0; declined")


def test_unknown_figures_spill_as_before() -> None:
    busy, other = _link("busy", "m", queue_eta={"m": None}), _link("other")
    weighed, _ = spill.decide([(busy, "m")], [(other, "m", {"predicted_seconds": 3.0})])
    assert weighed.taken and "from=busy; wait=unknown" in weighed.header()
    busy.heard({"queue_eta": {"m": 30.0}})  # the load never measured anywhere
    weighed, _ = spill.decide([(busy, "m")], [(other, "m", {"predicted_seconds": None})])
    assert weighed.taken and weighed.header().endswith("load=unknown; taken")


def test_a_full_box_that_said_a_slot_was_free_said_so_before_its_slots_were_taken() -> None:
    """The central counts every slot of the busy box taken by its own calls; the box's last
    word came before the last of them took its slot (taking one moves no counter)."""
    busy, other = _link("busy", "m", queue_eta={"m": 0.0}), _link("other")
    weighed, _ = spill.decide([(busy, "m")], [(other, "m", {"predicted_seconds": 3.0})])
    assert weighed.taken and "from=busy; wait=unknown" in weighed.header()


def test_a_wait_said_earlier_is_counted_down() -> None:
    busy = _link("busy", "m", queue_eta={"m": 30.0})
    busy.queue_eta_at -= 25  # said 25 s ago
    wait = busy.predicted_wait("m")
    assert wait is not None and 4.5 <= wait <= 5.0
    busy.queue_eta_at -= 10  # its moment passed, and the box said nothing since: overdue
    assert busy.predicted_wait("m") is None
    busy.heard({"queue_eta": {"m": 0.0}})  # a slot free
    assert busy.predicted_wait("m") == 0.0


async def _first(
    tmp_path: Path, eta: float, load: float
) -> tuple[routing.Candidate, dict[str, str]]:
    def plan(request: httpx.Request) -> httpx.Response:
        assert request.url.host == "other.test"  # the busy box's plan is not asked for
        return httpx.Response(200, json={"decision": "place", "predicted_seconds": load})

    store = CentralStore(tmp_path / "central.sqlite3")
    async with httpx.AsyncClient(transport=httpx.MockTransport(plan)) as client:
        fleet = Fleet(store, client)
        fleet.links = {"busy": _link("busy", "m", queue_eta={"m": eta}), "other": _link("other")}
        try:
            found = await routing.candidates(fleet, "m", enough=1)
        finally:
            await fleet.close()
            store.close()
    headers: dict[str, str] = {}
    if found[0].spill is not None:
        headers[spill.HEADER] = found[0].spill.header()
    return found[0], headers


@pytest.mark.parametrize(
    ("eta", "load", "box", "why", "word"),
    [(30.0, 3.0, "other", "spill", "taken"), (1.0, 3.0, "busy", "resident", "declined")],
    ids=["a-long-wait-spills", "a-short-wait-queues"],
)
def test_the_central_routes_by_the_waits_and_says_them(
    tmp_path: Path, eta: float, load: float, box: str, why: str, word: str
) -> None:
    first, headers = asyncio.run(_first(tmp_path, eta, load))
    assert (first.link.record.box_id, first.why) == (box, why)
    assert headers[spill.HEADER].startswith(f"from=busy; wait={eta:.1f}; to=other;")
    assert headers[spill.HEADER].endswith(word)
