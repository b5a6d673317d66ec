"""Routing by what the central knows of each box, with real processes on loopback: one
`fitbox central serve` (a 2 s long-poll, so a late one is seen within seconds) and two
`fitbox serve` boxes with real llama-server children on SmolLM2. A frozen box (SIGSTOP) is
suspected and skipped; a dead box (SIGKILL) the central sees unreachable gets no new call;
a box killed mid-stream leaves the client an error event and ``data: [DONE]``; after a
restart of the central, a model its boxes had is a 503 with Retry-After until one syncs.
Every hold is a signal the test sends; every wait has a generous bound."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from .support.central import Central, kill_box, up_at, worker_key
from .support.clients import openai_client
from .support.holds import HOLD_IDLE_TIMEOUT, Background, engine_stopped, resident, until
from .support.processes import FitboxProcess, start_fitbox, stop_fitbox

pytestmark = pytest.mark.engine
SMOL = "SmolLM2-135M-Instruct.Q4_1"
HI = {"prompt": "Hi", "max_tokens": 2}


@dataclass
class Site:
    central: Central
    key: str
    models: Path
    boxes: list[FitboxProcess]  # boxes[0] has the lower id: a tie goes to it first
    ids: list[str]


def _box_id(box: FitboxProcess) -> str:
    return str(httpx.get(f"{box.url}/health", timeout=10).json()["box_id"])


def _join(site_key: str, central: Central, models: Path, home: Path) -> FitboxProcess:
    return start_fitbox(
        home, [models], "--central", central.url, "--central-key", site_key, env=HOLD_IDLE_TIMEOUT
    )


def _state(central: Central, box_id: str) -> str | None:
    found: str | None = central.fleet().get(box_id, {}).get("state")
    return found


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, smollm2: Path) -> Iterator[Site]:
    central = Central(tmp_path_factory.mktemp("central"), env={"FITBOX_CENTRAL_LONG_POLL": "2"})
    key = worker_key(central.home)
    models = tmp_path_factory.mktemp("models")
    (models / smollm2.name).symlink_to(smollm2)
    central.start()
    boxes: list[FitboxProcess] = []
    try:
        homes = [tmp_path_factory.mktemp(f"box-{name}") for name in ("a", "b")]
        starting = [
            Background(lambda h=h: _join(key, central, models, h))  # type: ignore[misc]
            for h in homes
        ]
        for start in starting:
            boxes.append(start.result())
        boxes.sort(key=_box_id)
        ids = [_box_id(b) for b in boxes]
        until(lambda: all(_state(central, i) == "up" for i in ids), "both boxes mirrored")
        yield Site(central, key, models, boxes, ids)
    finally:
        for box in boxes:
            if box.proc.poll() is None:
                stop_fitbox(box)
        central.stop()


def _resident_on(site: Site, ids: list[str]) -> bool:
    models = site.central.get("/v1/models")["data"]
    entry: dict[str, Any] = next((m for m in models if m["id"] == SMOL), {})
    return set(entry.get("resident_on", [])) == set(ids)


def _resident_on_both(site: Site) -> None:
    """SMOL resident on both boxes, and the central knowing it: a bare name goes to the
    lower id first (both idle)."""
    for box in site.boxes:
        with openai_client(box.url) as direct:
            direct.completions.create(model=SMOL, prompt="Hi", max_tokens=2)
    until(lambda: _resident_on(site, site.ids), "the model resident on both, as the central sees")


def _restart(site: Site, index: int) -> None:
    """Box ``index`` started again on its home (its id, a new port), and followed again."""
    box = site.boxes[index]
    site.boxes[index] = _join(site.key, site.central, site.models, box.home)
    until(
        lambda: up_at(site.central, site.ids[index], site.boxes[index].url),
        "the restarted box followed at its new address",
        60,
    )


def _call(site: Site, model: str) -> httpx.Response:
    return httpx.post(f"{site.central.url}/v1/completions", json={"model": model, **HI}, timeout=60)


def _retry_later(answer: httpx.Response) -> dict[str, Any]:
    assert answer.status_code == 503, answer.text
    assert answer.headers["x-should-retry"] == "true"
    assert int(answer.headers["retry-after"]) >= 1
    error: dict[str, Any] = answer.json()["error"]
    assert error["code"] == "box_unavailable" and "GET /v1/fleet" in error["message"]
    return error


def test_a_frozen_box_is_suspected_and_gets_no_new_calls(site: Site) -> None:
    """Box a (the first a bare name would go to) is frozen: within seconds of its long-poll
    falling due the fleet view says suspected, a bare name goes to box b at once (not to
    the frozen box, where it would hang), and a call naming box a is a 503 to retry."""
    _resident_on_both(site)
    frozen, frozen_id, other_id = site.boxes[0], site.ids[0], site.ids[1]
    os.kill(frozen.proc.pid, signal.SIGSTOP)
    try:
        until(lambda: _state(site.central, frozen_id) == "suspected", "box a suspected")
        answer = _call(site, SMOL)
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-fitbox-box"] == other_id
        assert "x-fitbox-retried-from" not in answer.headers  # box a was not tried
        assert frozen_id in _retry_later(_call(site, f"{frozen_id}/{SMOL}"))["message"]
    finally:
        os.kill(frozen.proc.pid, signal.SIGCONT)
    until(lambda: _state(site.central, frozen_id) == "up", "box a up again after the thaw")


def test_an_unreachable_box_gets_no_new_calls(site: Site) -> None:
    """Box a is killed and the central sees it unreachable: a bare name goes to box b
    without trying box a first; box a by name is a 503 to retry, not a 502 not to."""
    _resident_on_both(site)
    dead_id, other_id = site.ids[0], site.ids[1]
    kill_box(site.boxes[0])
    until(lambda: _state(site.central, dead_id) == "unreachable", "box a unreachable")
    answer = _call(site, SMOL)
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-fitbox-box"] == other_id
    assert "x-fitbox-retried-from" not in answer.headers
    _retry_later(_call(site, f"{dead_id}/{SMOL}"))
    _restart(site, 0)


def _events(lines: Iterator[str]) -> Iterator[str]:
    for line in lines:
        if line.startswith("data: "):
            yield line.removeprefix("data: ")


def test_a_box_killed_mid_stream_ends_the_stream_with_an_error_event_and_done(
    site: Site,
) -> None:
    """A stream through the central is under way (its first event came); its engine is
    stopped (so the stream cannot end of itself) and its box killed: the client reads an
    OpenAI-shaped error event and ``data: [DONE]``, not a broken connection."""
    _resident_on_both(site)
    box, box_id = site.boxes[0], site.ids[0]
    engine = int(resident(box, SMOL)["pid"])
    body = {"model": f"{box_id}/{SMOL}", "prompt": "Once upon a time", "max_tokens": 2000}
    with httpx.stream(
        "POST",
        f"{site.central.url}/v1/completions",
        json={**body, "stream": True, "ignore_eos": True},
        timeout=60,
    ) as response:
        assert response.status_code == 200
        events = _events(response.iter_lines())
        assert "choices" in json.loads(next(events))
        os.kill(engine, signal.SIGSTOP)
        kill_box(box)
        with contextlib.suppress(ProcessLookupError):
            os.kill(engine, signal.SIGKILL)
        rest = list(events)
    assert rest[-1] == "[DONE]", rest[-3:]
    error = json.loads(rest[-2])["error"]
    assert error["code"] == "box_lost" and box_id in error["message"]
    assert {"type", "param"} <= set(error)
    assert all("choices" in json.loads(e) for e in rest[:-2])  # whole events before it
    _restart(site, 0)


def test_a_call_spills_to_a_box_where_it_fits_when_every_slot_of_the_resident_is_taken(
    site: Site,
) -> None:
    """The model is resident on box a only, its engine stopped with every slot holding a
    call through the central: a bare name goes to box b, where the model fits without
    evicting anything (route spill), instead of waiting behind them on box a."""
    _resident_on_both(site)
    busy, busy_id, other_id = site.boxes[0], site.ids[0], site.ids[1]
    unloaded = httpx.post(
        f"{site.boxes[1].url}/v1/operator/unload", json={"model": SMOL}, timeout=60
    )
    assert unloaded.status_code == 200, unloaded.text
    until(lambda: _resident_on(site, [busy_id]), "the model resident on box a only")
    slots = int(resident(busy, SMOL)["parallel"])
    with engine_stopped(busy, SMOL):
        held = [Background(lambda: _call(site, f"{busy_id}/{SMOL}")) for _ in range(slots)]
        until(
            lambda: site.central.fleet()[busy_id]["in_flight"] == slots,
            "every slot of box a holding a call through the central",
        )
        answer = _call(site, SMOL)
    assert answer.status_code == 200, answer.text
    assert (answer.headers["x-fitbox-box"], answer.headers["x-fitbox-route"]) == (
        other_id,
        "spill",
    )
    assert all(call.result().status_code == 200 for call in held)


def test_after_a_restart_of_the_central_a_known_model_is_503_until_its_box_syncs(
    site: Site,
) -> None:
    """The central is restarted while both boxes are frozen: the model they had is known
    from the store (503 with Retry-After, not 404 model_not_found) until one answers."""
    _resident_on_both(site)
    site.central.stop()
    for box in site.boxes:
        os.kill(box.proc.pid, signal.SIGSTOP)
    try:
        site.central.start()
        answer = _call(site, SMOL)
        error = _retry_later(answer)
        assert all(box_id in error["message"] for box_id in site.ids)
        listed = [m["id"] for m in site.central.get("/v1/models")["data"]]
        assert SMOL in listed  # the last-known list, before any sync
    finally:
        for box in site.boxes:
            os.kill(box.proc.pid, signal.SIGCONT)
    until(lambda: all(_state(site.central, i) == "up" for i in site.ids), "both boxes synced")
    assert _call(site, SMOL).status_code == 200
