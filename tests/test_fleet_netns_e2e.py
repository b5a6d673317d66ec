"""A fleet as an operator runs one, on one host: three `fitbox serve` boxes, each in a network
namespace of its own under its own hostname (tests/support/netns.py), a fourth namespace for
a stranger, and one `fitbox central serve` on the bridge with its store in PostgreSQL. Real
llama-server children on SmolLM2; a 2 s long-poll, so a late one is seen within seconds.

The cases of issue #37's proof, one test each: a worker key and a known box id from another
machine do not take the box over; a copy of a box's home served on another machine joins as
a box of its own; a call in flight on a box killed (kill -9) reaches the central as
interrupted once the box is back; a frozen box (SIGSTOP) is suspected and gets no new calls,
and thawed loses and repeats nothing; a box cut off the network (its link down) is marked
unreachable and skipped, and back on it syncs what it served alone; after a kill -9 of the
central, a model its boxes had is a 503 to retry until one syncs; the central's PostgreSQL
stopped is a 503 naming the store, and started again, the calls are served and the mirror is
whole. Each test leaves the fleet as it found it: three boxes up. Every hold is an event the
test makes (a signal, a link set down); every wait has a generous bound."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from .support.central import Central, kill_box, mirrored_exactly, up_at, worker_key
from .support.holds import HOLD_IDLE_TIMEOUT, Background, calls_on, engine_stopped, until
from .support.netns import Namespace, Network, network, start_box_in
from .support.postgres import PostgresCluster
from .support.processes import FitboxProcess, stop_fitbox

pytestmark = pytest.mark.engine
SMOL = "SmolLM2-135M-Instruct.Q4_1"
HI = {"prompt": "Hi", "max_tokens": 2}
HOSTNAMES = ["box-a", "box-b", "box-c", "stranger"]


@dataclass
class Site:
    net: Network
    postgres: PostgresCluster
    central: Central
    key: str  # the worker key every box is started with
    inference: str  # a key of the central's for inference clients
    models: Path
    boxes: list[FitboxProcess]  # sorted by id: boxes[0] is the one a tie goes to
    ids: list[str]
    spaces: list[Namespace]  # each box's namespace, by the same index

    @property
    def stranger(self) -> Namespace:
        return self.net.namespaces[-1]


def _box_id(box: FitboxProcess) -> str:
    return str(httpx.get(f"{box.url}/health", timeout=10).json()["box_id"])


def _join(space: Namespace, home: Path, models: Path, central: Central, key: str) -> FitboxProcess:
    return start_box_in(
        space, home, [models], "--central", central.url, "--central-key", key, env=HOLD_IDLE_TIMEOUT
    )


def _state(central: Central, box_id: str) -> str | None:
    found: str | None = central.fleet().get(box_id, {}).get("state")
    return found


def _all_up(site: Site) -> bool:
    fleet = site.central.fleet()
    return all(fleet.get(i, {}).get("state") == "up" for i in site.ids)


@pytest.fixture(scope="module")
def site(
    tmp_path_factory: pytest.TempPathFactory, smollm2: Path, llama_server_bin: Path
) -> Iterator[Site]:
    with contextlib.ExitStack() as stack:
        net = stack.enter_context(network(HOSTNAMES))
        postgres = PostgresCluster.start()  # its own: the PostgreSQL case stops it
        stack.callback(postgres.stop)
        env = {"FITBOX_CENTRAL_DB": postgres.create_database(), "FITBOX_CENTRAL_LONG_POLL": "2"}
        central = Central(tmp_path_factory.mktemp("central"), env=env, host=net.address)
        key = worker_key(central.home, env=env)
        inference = worker_key(central.home, "inference", env=env)
        models = tmp_path_factory.mktemp("models")
        (models / smollm2.name).symlink_to(smollm2)
        central.start()
        stack.callback(central.stop)
        boxes: list[FitboxProcess] = []

        def stop_boxes() -> None:
            for box in boxes:
                _stop_box(box)

        stack.callback(stop_boxes)
        spaces = list(net.namespaces[:3])
        starting = [
            Background(
                lambda s=s: _join(  # type: ignore[misc]
                    s, tmp_path_factory.mktemp(s.hostname), models, central, key
                )
            )
            for s in spaces
        ]  # side by side: a start is mostly imports
        for start in starting:
            with contextlib.suppress(Exception):  # one that failed is raised below
                boxes.append(start.result())
        assert len(boxes) == len(spaces), [start.result() for start in starting]
        by_address = {s.address: s for s in spaces}
        boxes.sort(key=_box_id)
        ids = [_box_id(b) for b in boxes]
        in_order = [by_address[httpx.URL(b.url).host] for b in boxes]
        made = Site(net, postgres, central, key, inference, models, boxes, ids, in_order)
        until(lambda: _all_up(made), "the three boxes registered and followed", 60)
        yield made


def _stop_box(box: FitboxProcess) -> None:
    if box.proc.poll() is None:
        stop_fitbox(box)


def _restart(site: Site, index: int) -> None:
    """Box ``index`` started again on its home in its namespace (its id, a new port), and
    followed again."""
    box = site.boxes[index]
    site.boxes[index] = _join(site.spaces[index], box.home, site.models, site.central, site.key)
    until(
        lambda: up_at(site.central, site.ids[index], site.boxes[index].url),
        "the restarted box followed at its new address",
        60,
    )


def _direct(box: FitboxProcess) -> httpx.Response:
    """A call on the box itself, from the host (with its admin key)."""
    return httpx.post(
        f"{box.url}/v1/completions",
        json={"model": SMOL, **HI},
        headers=box.headers,
        timeout=120,
    )


def _via_central(site: Site, model: str, timeout: float = 60) -> httpx.Response:
    return httpx.post(
        f"{site.central.url}/v1/completions", json={"model": model, **HI}, timeout=timeout
    )


def _resident_on(site: Site, ids: list[str]) -> bool:
    models = site.central.get("/v1/models")["data"]
    entry: dict[str, Any] = next((m for m in models if m["id"] == SMOL), {})
    return set(entry.get("resident_on", [])) == set(ids)


def _resident_everywhere(site: Site) -> None:
    for box in site.boxes:
        answer = _direct(box)
        assert answer.status_code == 200, answer.text
    until(lambda: _resident_on(site, site.ids), "the model resident on the three boxes", 60)


def _all_mirrored(site: Site) -> None:
    for box, box_id in zip(site.boxes, site.ids, strict=True):
        until(
            lambda b=box, i=box_id: mirrored_exactly(site.central, b, i),  # type: ignore[misc]
            "every call row of every box mirrored once",
            60,
        )


def _retry_later(answer: httpx.Response) -> dict[str, Any]:
    assert answer.status_code == 503, answer.text
    assert answer.headers["x-should-retry"] == "true"
    assert int(answer.headers["retry-after"]) >= 1
    error: dict[str, Any] = answer.json()["error"]
    assert error["code"] == "box_unavailable" and "GET /v1/fleet" in error["message"]
    return error


def _post_from(space: Namespace, url: str, body: dict[str, Any], key: str) -> dict[str, Any]:
    """``body`` POSTed to ``url`` by a client in ``space`` (another machine); its status
    and JSON body."""
    code = (
        "import httpx, json\n"
        f"r = httpx.post({url!r}, json={body!r}, "
        f"headers={{'Authorization': 'Bearer ' + {key!r}}}, timeout=60)\n"
        "print(json.dumps({'status': r.status_code, 'body': r.json()}))\n"
    )
    found: dict[str, Any] = json.loads(space.python(code, timeout=120))
    return found


def test_a_worker_key_and_a_known_box_id_from_another_machine_do_not_take_the_box_over(
    site: Site,
) -> None:
    """The stranger (a fourth machine) holds the worker key from any box's command line and
    box a's public id, and registers at its own address: refused; with box a's secret too
    (its disk copied whole), refused while box a answers. The central still sends box a's
    calls to box a."""
    box, box_id = site.boxes[0], site.ids[0]
    health = httpx.get(f"{box.url}/health", timeout=10).json()
    thief = {
        "box_id": box_id,
        "name": health["name"],
        "version": health["version"],
        "url": f"http://{site.stranger.address}:8484",
        "admin_key": "fb_000000000000_" + "t" * 43,
    }
    assert health["name"] == site.spaces[0].hostname  # its machine's own name
    refused = _post_from(site.stranger, f"{site.central.url}/v1/boxes", thief, site.key)
    assert refused["status"] == 403, refused
    assert refused["body"]["error"]["code"] == "box_identity_unproven"
    twin = {**thief, "box_secret": (box.home / "central.secret").read_text().strip()}
    in_use = _post_from(site.stranger, f"{site.central.url}/v1/boxes", twin, site.key)
    assert in_use["status"] == 409, in_use
    assert in_use["body"]["error"]["code"] == "box_id_in_use"
    assert up_at(site.central, box_id, box.url)
    named = _via_central(site, f"{box_id}/{SMOL}")
    assert named.status_code == 200, named.text
    assert named.headers["x-fitbox-box"] == box_id
    assert site.central.fleet()[box_id]["name"] == health["name"]


def test_a_copy_of_a_box_s_home_served_on_another_machine_joins_as_a_box_of_its_own(
    site: Site, tmp_path: Path
) -> None:
    """Box c's home is copied while it is stopped (a cloned VM's disk) and served on the
    stranger's machine beside the original, started again on its own: the copy takes a new
    id and says why; the central lists both, each at its own address, the original's mirror
    holding its own calls only."""
    index = 2
    original_id = site.ids[index]
    stop_fitbox(site.boxes[index])
    copy_home = tmp_path / "copy"
    shutil.copytree(site.boxes[index].home, copy_home, symlinks=True)
    _restart(site, index)
    copy = _join(site.stranger, copy_home, site.models, site.central, site.key)
    try:
        copy_id = _box_id(copy)
        assert copy_id != original_id and f"a copy of box {original_id}" in copy.log()
        until(lambda: up_at(site.central, copy_id, copy.url), "the copy followed, as itself")
        assert up_at(site.central, original_id, site.boxes[index].url)
        answer = _direct(copy)
        assert answer.status_code == 200, answer.text
        assert _direct(site.boxes[index]).status_code == 200
        until(lambda: mirrored_exactly(site.central, copy, copy_id), "the copy's rows, its own")
        until(
            lambda: mirrored_exactly(site.central, site.boxes[index], original_id),
            "the original's rows, none of the copy's among them",
        )
        fleet = site.central.fleet()
        names = (fleet[copy_id]["name"], fleet[original_id]["name"])
        assert names == (site.stranger.hostname, site.spaces[index].hostname)
    finally:
        stop_fitbox(copy)
    removed = httpx.delete(f"{site.central.url}/v1/fleet/boxes/{copy_id}", timeout=30)
    assert removed.status_code == 200, removed.text
    assert set(site.central.fleet()) == set(site.ids)


def test_a_call_in_flight_on_a_killed_box_reaches_the_central_as_interrupted(
    site: Site,
) -> None:
    """A call through the central, naming box b, is held by box b's stopped engine (SIGSTOP)
    until the central has mirrored it pending; box b is killed (SIGKILL) and started again
    in its namespace: its store closes the row as interrupted, and the central's copy
    follows."""
    index = 1
    box, box_id = site.boxes[index], site.ids[index]
    assert _direct(box).status_code == 200  # loaded
    with engine_stopped(box, SMOL):
        held = Background(lambda: _via_central(site, f"{box_id}/{SMOL}", timeout=120))
        until(lambda: calls_on(box, SMOL) == 1, "the call taken by the stopped engine")
        pending = until(
            lambda: [
                r for r in site.central.mirrored("call_log", box_id) if r["outcome"] == "pending"
            ],
            "the central's copy of the call, pending",
        )
        kill_box(box)
    with contextlib.suppress(httpx.TransportError):
        assert held.result().status_code != 200  # its box died under it
    call_id = int(pending[0]["id"])
    _restart(site, index)

    def interrupted() -> dict[str, Any] | None:
        rows = [r for r in site.central.mirrored("call_log", box_id) if r["id"] == call_id]
        return rows[0] if rows and rows[0]["outcome"] == "interrupted" else None

    row = until(interrupted, "the central's copy of the call, interrupted", 60)
    (own,) = [r for r in site.boxes[index].calls() if r["id"] == call_id]
    assert own["outcome"] == "interrupted" and row["seq"] == own["seq"]
    until(lambda: mirrored_exactly(site.central, site.boxes[index], box_id), "box b mirrored")


def test_a_frozen_box_is_suspected_gets_no_new_calls_and_thawed_loses_nothing(
    site: Site,
) -> None:
    """Box a (the first a bare name would go to) is frozen with a call of its own waiting
    on it: within seconds the central says suspected, a bare name goes to another box at
    once and a call naming box a is a 503 to retry. Thawed (SIGCONT), the waiting call is
    answered, box a is up again, and every row of every box is mirrored once."""
    _resident_everywhere(site)
    frozen, frozen_id = site.boxes[0], site.ids[0]
    os.kill(frozen.proc.pid, signal.SIGSTOP)
    try:
        waiting = Background(lambda: _direct(frozen))
        until(lambda: _state(site.central, frozen_id) == "suspected", "box a suspected")
        answer = _via_central(site, SMOL)
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-fitbox-box"] in site.ids[1:]
        assert "x-fitbox-retried-from" not in answer.headers  # box a was not tried
        assert frozen_id in _retry_later(_via_central(site, f"{frozen_id}/{SMOL}"))["message"]
        assert waiting.is_alive()  # nothing answers on a frozen box
    finally:
        os.kill(frozen.proc.pid, signal.SIGCONT)
    assert waiting.result().status_code == 200
    until(lambda: _state(site.central, frozen_id) == "up", "box a up again after the thaw")
    _all_mirrored(site)


def _served_inside(space: Namespace, box: FitboxProcess) -> None:
    """A call on ``box`` from a client on its own machine (the host cannot reach it now)."""
    code = (
        "import httpx\n"
        f"r = httpx.post({box.url + '/v1/completions'!r}, json={{'model': {SMOL!r}, "
        f"'prompt': 'Hi', 'max_tokens': 2}}, headers={box.headers!r}, timeout=120)\n"
        "assert r.status_code == 200, r.text\n"
    )
    space.python(code, timeout=180)


def test_a_box_cut_off_the_network_is_skipped_and_back_on_it_syncs_what_it_served(
    site: Site,
) -> None:
    """Box b's link is set down: the central marks it unreachable and sends a bare name to
    the others without trying it, and a call naming it is a 503 to retry; box b serves its
    own machine meanwhile. The link up again, box b is followed again and every row it
    wrote while cut off is mirrored, once."""
    _resident_everywhere(site)
    index = 1
    box, box_id, space = site.boxes[index], site.ids[index], site.spaces[index]
    before = len(box.calls())
    with space.link_cut():
        until(lambda: _state(site.central, box_id) == "unreachable", "box b unreachable", 60)
        answer = _via_central(site, SMOL)
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-fitbox-box"] != box_id
        assert "x-fitbox-retried-from" not in answer.headers
        _retry_later(_via_central(site, f"{box_id}/{SMOL}"))
        for _ in range(2):
            _served_inside(space, box)
    assert len(box.calls()) == before + 2
    until(lambda: _state(site.central, box_id) == "up", "box b followed again", 60)
    until(lambda: mirrored_exactly(site.central, box, box_id), "box b's rows, once each", 60)
    named = _via_central(site, f"{box_id}/{SMOL}")
    assert named.status_code == 200 and named.headers["x-fitbox-box"] == box_id


def test_after_a_kill_9_of_the_central_a_known_model_is_503_until_its_boxes_sync(
    site: Site,
) -> None:
    """The central is killed (SIGKILL) and started again while every box is cut off: the
    model the boxes had is known from the store (503 with Retry-After naming them, not 404
    model_not_found) and listed; the links up again, the boxes sync and the call is
    served."""
    _resident_everywhere(site)
    site.central.stop(signal.SIGKILL)
    with contextlib.ExitStack() as links:
        for space in site.spaces:
            links.enter_context(space.link_cut())
        site.central.start()
        error = _retry_later(_via_central(site, SMOL))
        assert all(box_id in error["message"] for box_id in site.ids)
        assert SMOL in [m["id"] for m in site.central.get("/v1/models")["data"]]
    until(lambda: _all_up(site), "the three boxes followed again", 60)
    answer = _via_central(site, SMOL)
    assert answer.status_code == 200, answer.text
    _all_mirrored(site)


def test_while_the_central_s_postgresql_is_down_calls_are_503_naming_it_and_after_it_all_syncs(
    site: Site,
) -> None:
    """The central's PostgreSQL is stopped: a keyed call is 503 store_unavailable naming
    the store (not 401: the key was never checked) and /health says the store is down; the
    boxes serve their own callers meanwhile. Started again on its port, the central serves
    the keyed call and its mirror holds every row of every box, once."""
    keyed = {"Authorization": f"Bearer {site.inference}"}
    site.postgres.halt()
    try:
        for _ in range(2):  # the first meets the dropped connection, the next the refusal
            answer = httpx.post(
                f"{site.central.url}/v1/completions",
                json={"model": SMOL, **HI},
                headers=keyed,
                timeout=60,
            )
            assert answer.status_code == 503, answer.text
            error = answer.json()["error"]
            assert error["code"] == "store_unavailable"
            assert f"127.0.0.1:{site.postgres.port}/" in error["message"]
            assert site.postgres.password not in error["message"]
        health = httpx.get(f"{site.central.url}/health", timeout=30).json()
        assert (health["status"], health["store"]) == ("degraded", "down")
        for box in site.boxes:
            assert _direct(box).status_code == 200
    finally:
        site.postgres.resume()

    def served() -> httpx.Response | None:
        answer = httpx.post(
            f"{site.central.url}/v1/completions",
            json={"model": SMOL, **HI},
            headers=keyed,
            timeout=60,
        )
        return answer if answer.status_code == 200 else None

    until(served, "a keyed call served once the store is back", 60)
    health = httpx.get(f"{site.central.url}/health", timeout=30).json()
    assert (health["status"], health["store"]) == ("ok", "up")
    _all_mirrored(site)
