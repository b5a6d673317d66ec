"""The central with real boxes: three `fitbox serve` processes (own homes, own loopback
ports, real llama-server children on SmolLM2 and a generated llama) and one `fitbox central
serve`, all on loopback. Registration, mirroring (exactly once, through a kill -9 of the
central, a box frozen for 30 s and thawed, and a box that moves port), the fleet view,
limits set from the centre, facts one box measured (footprints, speeds, refused windows)
priced on another, routing by BOX/MODEL and by bare name with the openai SDK (resident,
fits, fits elsewhere when the resident box is full), SSE through, and the retry before the
first byte on a box the test kills. Boxes are sorted by id: boxes[0] wins a tie; boxes[2]
runs an engine only in the tests that call it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest

from fitbox.home import Home

from .support.central import Central, mirrored_exactly, worker_key
from .support.clients import openai_client
from .support.ggufs import two_models_one_at_a_time
from .support.holds import HOLD_IDLE_TIMEOUT, Background, calls_on, engine_stopped, until
from .support.postgres import PostgresCluster
from .support.processes import FitboxProcess, start_fitbox, stop_fitbox

pytestmark = pytest.mark.engine
SMOL = "SmolLM2-135M-Instruct.Q4_1"
TINY = "tiny"  # the generated llama beside SmolLM2 in every box's model root
HELLO: list[Any] = [{"role": "user", "content": "Say hello."}]


@dataclass
class Fleet:
    central: Central
    boxes: list[FitboxProcess]
    ids: list[str]
    worker_key: str
    models: Path
    one_at_a_time: int  # a RAM cap that holds SmolLM2 or the tiny llama, not both


def _box_id(box: FitboxProcess) -> str:
    return str(httpx.get(f"{box.url}/health", timeout=10).json()["box_id"])


def _join(home: Path, models: Path, central: Central, key: str) -> FitboxProcess:
    return start_fitbox(
        home, [models], "--central", central.url, "--central-key", key, env=HOLD_IDLE_TIMEOUT
    )


def _fleet_model(central: Central, name: str) -> dict[str, Any]:
    """One model's entry of /v1/fleet/models."""
    found: list[dict[str, Any]] = [
        m for m in central.get("/v1/fleet/models")["data"] if m["id"] == name
    ]
    assert len(found) == 1, found
    return found[0]


def _all_up(central: Central, ids: list[str]) -> bool:
    fleet = central.fleet()
    return all(fleet.get(i, {}).get("state") == "up" for i in ids)


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory, smollm2: Path, llama_server_bin: Path
) -> Iterator[Fleet]:
    # a 5 s long-poll (25 s by default): a box frozen for 30 s outlasts its 15 s answer bound
    central = Central(tmp_path_factory.mktemp("central"), env={"FITBOX_CENTRAL_LONG_POLL": "5"})
    key = worker_key(central.home)
    models = tmp_path_factory.mktemp("models") / "root"
    cap = two_models_one_at_a_time(models, smollm2)
    central.start()
    boxes: list[FitboxProcess] = []
    try:
        homes = [tmp_path_factory.mktemp(f"box-{name}") for name in ("a", "b", "c")]
        starting = [
            Background(lambda h=h: _join(h, models, central, key))  # type: ignore[misc]
            for h in homes
        ]  # started side by side: a start is mostly imports
        for start in starting:
            with contextlib.suppress(Exception):  # one that failed is raised below
                boxes.append(start.result())
        assert len(boxes) == len(homes), [start.result() for start in starting]
        boxes.sort(key=_box_id)  # ids[0] is the lowest id: the one a tie goes to first
        ids = [_box_id(b) for b in boxes]
        until(lambda: _all_up(central, ids), "the three boxes registered and mirrored")
        yield Fleet(central, boxes, ids, key, models, cap)
    finally:
        for box in boxes:
            _stop_box(box)
        central.stop()


def _stop_box(box: FitboxProcess, sig: int = signal.SIGTERM) -> None:
    """SIGTERM (the box stops its children) or SIGKILL (the test ends them itself)."""
    if box.proc.poll() is not None:
        return
    children = psutil.Process(box.proc.pid).children(recursive=True)
    if sig == signal.SIGTERM:
        stop_fitbox(box)
    else:
        box.proc.kill()
        box.proc.wait()
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


def test_boxes_register_with_a_persistent_id_reported_by_health(fleet: Fleet) -> None:
    for box, box_id in zip(fleet.boxes, fleet.ids, strict=True):
        health = httpx.get(f"{box.url}/health", timeout=10).json()
        assert uuid.UUID(health["box_id"]) and health["box_id"] == box_id
        assert health["address"] == box.url
        assert health["name"] and health["version"]
    assert len(set(fleet.ids)) == 3  # one host, one hostname, three boxes
    seen = fleet.central.fleet()
    assert set(seen) == set(fleet.ids)
    for box, box_id in zip(fleet.boxes, fleet.ids, strict=True):
        assert seen[box_id]["url"] == box.url and seen[box_id]["state"] == "up"
        assert "admin_key" not in seen[box_id]  # the box's key never leaves the central
        assert seen[box_id]["devices"] is not None


def test_a_bare_name_resident_nowhere_goes_where_the_box_s_plan_says_it_fits(
    fleet: Fleet,
) -> None:
    assert not any(m["resident_on"] for m in fleet.central.get("/v1/fleet/models")["data"])
    with fleet.central.client() as client:
        raw = client.chat.completions.with_raw_response.create(
            model=SMOL, messages=HELLO, max_tokens=8
        )
    assert raw.headers["x-fitbox-route"] == "fits"
    assert raw.headers["x-fitbox-box"] == fleet.ids[0]  # neither busy: the lower id


def test_a_named_box_serves_and_the_reply_says_which(fleet: Fleet) -> None:
    a = fleet.ids[0]
    with fleet.central.client() as client:
        raw = client.chat.completions.with_raw_response.create(
            model=f"{a}/{SMOL}", messages=HELLO, max_tokens=8
        )
    assert raw.headers["x-fitbox-box"] == a
    assert f'box;desc="{a}"' in raw.headers["server-timing"]
    assert raw.parse().choices[0].message.content
    assert fleet.boxes[0].models()[SMOL]["resident"] is True
    assert fleet.boxes[1].models()[SMOL]["resident"] is False


def test_a_bare_name_goes_to_the_box_where_it_is_resident(fleet: Fleet) -> None:
    a = fleet.ids[0]
    until(
        lambda: _fleet_model(fleet.central, SMOL)["resident_on"] == [a],
        "the central seeing the model resident on box a",
    )
    assert _fleet_model(fleet.central, SMOL) == {
        "id": SMOL,
        "resident_on": [a],
        "on_disk_on": sorted(fleet.ids),
        "fits_on": sorted(fleet.ids),
    }
    with fleet.central.client() as client:
        raw = client.chat.completions.with_raw_response.create(
            model=SMOL, messages=HELLO, max_tokens=8
        )
        listed = {m.id for m in client.models.list()}
    assert raw.headers["x-fitbox-box"] == a and raw.headers["x-fitbox-route"] == "resident"
    assert {SMOL, f"{a}/{SMOL}", f"{fleet.ids[1]}/{SMOL}"} <= listed


def _plan(box: FitboxProcess, model: str) -> dict[str, Any]:
    response = httpx.get(f"{box.url}/v1/plan", params={"model": model}, timeout=60)
    assert response.status_code == 200, response.text
    plan: dict[str, Any] = response.json()
    return plan


def test_a_footprint_one_box_measured_prices_the_first_load_of_the_others(fleet: Fleet) -> None:
    """Box a loaded SmolLM2 (the tests above); b and c hold the same bytes and never loaded
    it: the central offers a's footprint to both, and their plans price from it."""
    a = fleet.ids[0]
    own = until(
        lambda: [
            r for r in fleet.central.mirrored("measured_footprints", a) if r["origin_box"] is None
        ],
        "box a's footprint mirrored",
    )
    for box, box_id in zip(fleet.boxes[1:], fleet.ids[1:], strict=True):

        def imported(b: FitboxProcess = box) -> dict[str, Any] | None:
            plan = _plan(b, SMOL)
            return plan if plan["basis"] == "imported" else None

        plan = until(imported, f"box {box_id} pricing SmolLM2 from box a's measurement", 60)
        assert plan["decision"] == "place" and plan["measured_by"]["box_id"] == a
        (row,) = [r for r in own if r["id"] == plan["measured_by"]["row_id"]]
        assert (row["window"], row["type_k"], row["device"]) == (
            plan["window"],
            plan["type_k"],
            plan["device"],
        )
        measured = sum(
            row[k] for k in ("weights_bytes", "kv_bytes", "compute_bytes", "output_bytes")
        )
        assert sum(d["total_bytes"] for d in plan["devices"]) == measured

        def labelled_rows(i: str = box_id) -> list[dict[str, Any]]:
            return [
                r for r in fleet.central.mirrored("measured_footprints", i) if r["origin_box"] == a
            ]

        labelled = until(labelled_rows, "the import mirrored, labelled with its origin")
        assert labelled[0]["origin_id"] == row["id"]


def _refuse_by_hand(box: FitboxProcess, like: dict[str, Any], window: int) -> int:
    """A refused window in the box's store, with its event (what a load that ran out of
    memory writes: test_faults_e2e proves a real one does): the mirror's view of it, once
    the box's counter moves (a call)."""
    with contextlib.closing(sqlite3.connect(box.home / "fitbox.sqlite3", timeout=10)) as conn:
        row_id = conn.execute(
            "INSERT INTO refused_windows (artifact, artifact_size, artifact_mtime_ns, "
            "placement, window, type_k, type_v, detail, measured_at) VALUES "
            "(?, ?, ?, ?, ?, ?, ?, 'failed to allocate buffer for kv cache', ?)",
            (
                like["artifact"],
                like["artifact_size"],
                like["artifact_mtime_ns"],
                like["device"],
                window,
                like["type_k"],
                like["type_v"],
                time.time(),
            ),
        ).lastrowid
        seq = conn.execute(
            "INSERT INTO events (at, kind, tbl, row_id) VALUES (?, 'fact', 'refused_windows', ?)",
            (time.time(), row_id),
        ).lastrowid
        conn.execute("UPDATE refused_windows SET seq = ? WHERE id = ?", (seq, row_id))
        conn.commit()
    assert row_id is not None
    return row_id


def test_speeds_and_refused_windows_one_box_measured_reach_the_others(fleet: Fleet) -> None:
    """Box a served SmolLM2 (the tests above) and measured its speeds; b and c hold the same
    bytes and never called it: their ETAs come from a's speeds, named as a's. A window a's
    load was refused at is not the first b and c try, and says whose refusal it was."""
    a = fleet.ids[0]
    footprint = next(
        r for r in fleet.central.mirrored("measured_footprints", a) if r["origin_box"] is None
    )
    until(
        lambda: [
            r for r in fleet.central.mirrored("measured_speeds", a) if r["origin_box"] is None
        ],
        "box a's speeds mirrored",
    )
    top = 2 * footprint["window"]  # above the window a loaded at: nothing lifts it
    for box in fleet.boxes[1:]:
        before = _plan_at(box, top)
        assert before["band"]["max"] == top and before["refused_windows"] == []
    refused_id = _refuse_by_hand(fleet.boxes[0], footprint, top)
    with openai_client(fleet.boxes[0].url) as direct:
        direct.completions.create(model=SMOL, prompt="Hi", max_tokens=2)  # moves the counter
    for box, box_id in zip(fleet.boxes[1:], fleet.ids[1:], strict=True):

        def imported(b: FitboxProcess = box) -> dict[str, Any] | None:
            plan = _plan_at(b, top)
            return plan if plan["speeds_measured_by"] and plan["refused_windows"] else None

        plan = until(imported, f"box {box_id} pricing from box a's speeds and refusal", 60)
        assert plan["speeds_measured_by"] == [a]
        assert plan["refused_windows"] == [
            {"device": footprint["device"], "window": top, "origin_box": a}
        ]
        assert plan["decision"] == "place" and plan["band"]["max"] < top  # not tried first

        def labelled(i: str = box_id) -> list[dict[str, Any]]:
            return [r for r in fleet.central.mirrored("refused_windows", i) if r["origin_box"] == a]

        assert (
            until(labelled, "the import mirrored, labelled with its origin")[0]["origin_id"]
            == refused_id
        )
        speeds = until(
            lambda i=box_id: fleet.central.mirrored("measured_speeds", i),  # type: ignore[misc]
            "the imported speeds mirrored",
        )
        assert all(r["origin_box"] == a for r in speeds)  # labelled; none of its own yet


def _plan_at(box: FitboxProcess, window: int) -> dict[str, Any]:
    response = httpx.get(f"{box.url}/v1/plan", params={"model": SMOL, "ctx": window}, timeout=60)
    assert response.status_code == 200, response.text
    plan: dict[str, Any] = response.json()
    return plan


def test_the_central_sets_a_box_s_central_tier_under_the_box_s_own(fleet: Fleet) -> None:
    box, box_id = fleet.boxes[1], fleet.ids[1]
    path = f"/v1/fleet/boxes/{box_id}/limits"

    def ram(tiers: dict[str, Any]) -> dict[str, Any]:
        found: list[dict[str, Any]] = [t for t in tiers["data"] if t["resource"] == "ram"]
        return found[0]

    device = ram(httpx.get(f"{box.url}/v1/limits", timeout=30).json())["device"]
    own = httpx.post(f"{box.url}/v1/limits", json={"ram_max": device * 3 // 4}, timeout=30)
    assert own.status_code == 200, own.text
    try:
        taken = httpx.post(f"{fleet.central.url}{path}", json={"ram_max": device // 2}, timeout=30)
        assert taken.status_code == 200, taken.text
        assert taken.headers["x-fitbox-box"] == box_id
        on_box = ram(httpx.get(f"{box.url}/v1/limits", timeout=30).json())
        assert (on_box["box"], on_box["central"], on_box["effective"]) == (
            device * 3 // 4,
            device // 2,
            device // 2,
        )
        assert ram(fleet.central.get(path))["central"] == device // 2  # read through the central
        refused = httpx.post(
            f"{fleet.central.url}{path}", json={"ram_max": device * 7 // 8}, timeout=30
        )
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["code"] == "above_parent_tier" and error["param"] == "ram_max"
        assert "the central setting" in error["message"] and "box setting" in error["message"]
        assert ram(httpx.get(f"{box.url}/v1/limits", timeout=30).json())["central"] == device // 2
    finally:
        httpx.post(f"{fleet.central.url}{path}", json={"ram_max": None}, timeout=30)
        httpx.post(f"{box.url}/v1/limits", json={"ram_max": None}, timeout=30)
    assert ram(httpx.get(f"{box.url}/v1/limits", timeout=30).json())["central"] is None


def test_a_bare_name_goes_where_it_fits_when_the_resident_box_is_full(fleet: Fleet) -> None:
    """Box a (the lowest id, which a tie goes to) holds SmolLM2 with a call on it (its engine
    stopped by the test) and a RAM cap, set from the centre, that holds one model: the tiny
    llama would not fit there without evicting a serving model, so it goes to box b."""
    full, a = fleet.boxes[0], fleet.ids[0]
    path = f"{fleet.central.url}/v1/fleet/boxes/{a}/limits"
    assert fleet.boxes[0].models()[SMOL]["resident"] is True
    capped = httpx.post(path, json={"ram_max": fleet.one_at_a_time}, timeout=30)
    assert capped.status_code == 200, capped.text
    try:
        with engine_stopped(full, SMOL):
            held = Background(
                lambda: httpx.post(
                    f"{full.url}/v1/completions",
                    timeout=120,
                    json={"model": SMOL, "prompt": "Hi", "max_tokens": 2},
                )
            )
            until(lambda: calls_on(full, SMOL) == 1, "a call serving on box a")
            plan = _plan(full, TINY)
            assert not (plan["decision"] == "place" and not plan["victims"]), plan
            with fleet.central.client() as client:
                raw = client.completions.with_raw_response.create(
                    model=TINY, prompt="Hi", max_tokens=2
                )
            assert raw.headers["x-fitbox-box"] == fleet.ids[1]
            assert raw.headers["x-fitbox-route"] == "fits"
        assert held.result().status_code == 200  # the serving call was never hurt
    finally:
        httpx.post(path, json={"ram_max": None}, timeout=30)
    assert fleet.boxes[1].models()[TINY]["resident"] is True


def test_sse_passes_through_as_events(fleet: Fleet) -> None:
    b = fleet.ids[1]
    with fleet.central.client() as client:
        stream = client.chat.completions.create(
            model=f"{b}/{SMOL}",
            messages=HELLO,
            max_tokens=16,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        chunks = list(stream)
    usage = next((c.usage for c in chunks if c.usage), None)
    assert usage is not None and usage.completion_tokens == 16  # the stream's end came too
    assert len(chunks) > 3  # as events, not one body
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_every_call_is_mirrored_once_in_its_final_form(fleet: Fleet) -> None:
    for box in fleet.boxes:
        with openai_client(box.url) as direct:
            for _ in range(3):
                direct.completions.create(model=SMOL, prompt="Hi", max_tokens=2)
    for box, box_id in zip(fleet.boxes, fleet.ids, strict=True):
        until(
            lambda b=box, i=box_id: mirrored_exactly(fleet.central, b, i),  # type: ignore[misc]
            "every call row mirrored once",
        )
    tables = {t["name"]: t for t in fleet.central.get("/v1/telemetry/tables")["data"]}
    assert {"call_log", "children", "resource_log", "mirror_rejects"} <= set(tables)
    assert tables["call_log"]["columns"][0] == "box_id"
    children = fleet.central.mirrored("children", fleet.ids[0])
    assert children and all(c["artifact"] for c in children)


FROZEN_S = 30.0  # the proof: a box stopped this long and brought back


def _in_state(central: Central, box_id: str, state: str) -> dict[str, Any] | None:
    """The box's entry of the fleet view while it is in ``state``."""
    box = central.fleet()[box_id]
    return box if box["state"] == state else None


def test_a_box_frozen_for_30_s_and_thawed_loses_nothing_and_repeats_nothing(
    fleet: Fleet,
) -> None:
    """Box c is frozen (SIGSTOP: its sockets still take connections, nothing answers) while
    calls wait on it, direct and through the central, and the rest of the fleet goes on. The
    central's long-poll to it runs out (the fixture's 5 s long-poll and its 10 s margin, well
    inside the freeze) and marks it unreachable; the freeze is held by the test's own events
    (that mark seen, the other box's rows mirrored, the calls waiting) and for 30 s at least;
    thawed (SIGCONT), every call is answered and every row is mirrored once."""
    frozen, frozen_id = fleet.boxes[2], fleet.ids[2]
    other, other_id = fleet.boxes[0], fleet.ids[0]
    with openai_client(frozen.url) as direct:
        direct.completions.create(model=SMOL, prompt="Hi", max_tokens=2)
    until(lambda: mirrored_exactly(fleet.central, frozen, frozen_id), "box c's rows mirrored")
    os.kill(frozen.proc.pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        waiting = [
            Background(
                lambda: httpx.post(
                    f"{frozen.url}/v1/completions",
                    timeout=120,
                    json={"model": SMOL, "prompt": "Hi", "max_tokens": 2},
                )
            ),
            Background(
                lambda: httpx.post(
                    f"{fleet.central.url}/v1/completions",
                    timeout=120,
                    json={"model": f"{frozen_id}/{SMOL}", "prompt": "Hi", "max_tokens": 2},
                )
            ),
        ]
        with openai_client(other.url) as direct:
            direct.completions.create(model=SMOL, prompt="Hi", max_tokens=2)
        until(
            lambda: mirrored_exactly(fleet.central, other, other_id),
            "the rest of the fleet mirrored while box c is frozen",
        )
        seen = until(
            lambda: _in_state(fleet.central, frozen_id, "unreachable"),
            "the central's long-poll to the frozen box running out",
            FROZEN_S,
        )
        assert "TimeoutError" in seen["last_error"]  # it ran out: no connection was refused
        assert all(w.is_alive() for w in waiting)  # nothing answers on a frozen box
        time.sleep(max(0.0, FROZEN_S - (time.monotonic() - stopped_at)))  # the 30 s
        assert all(w.is_alive() for w in waiting)
    finally:
        os.kill(frozen.proc.pid, signal.SIGCONT)
    for call in waiting:
        answer = call.result()
        assert answer.status_code == 200, answer.text
    assert len(frozen.calls()) >= 3
    until(
        lambda: mirrored_exactly(fleet.central, frozen, frozen_id),
        "box c's rows, the ones taken while frozen too, mirrored once each",
    )
    until(lambda: fleet.central.fleet()[frozen_id]["state"] == "up", "box c up again")


def test_a_row_the_mirror_cannot_take_is_kept_raw_and_the_rest_syncs(fleet: Fleet) -> None:
    box, box_id = fleet.boxes[1], fleet.ids[1]
    bad_id = 10**9  # far above the ids the box hands out
    with contextlib.closing(sqlite3.connect(box.home / "fitbox.sqlite3", timeout=10)) as conn:
        conn.execute(
            "INSERT INTO call_log (id, request_id, endpoint, received_at, outcome, "
            "prompt_tokens) VALUES (?, 'by-hand', '/v1/completions', ?, 'ok', "
            "'many')",
            (bad_id, time.time()),
        )
        seq = conn.execute(
            "INSERT INTO events (at, kind, tbl, row_id) VALUES (?, 'call', 'call_log', ?)",
            (time.time(), bad_id),
        ).lastrowid
        conn.execute("UPDATE call_log SET seq = ? WHERE id = ?", (seq, bad_id))
        conn.commit()
    with openai_client(box.url) as direct:
        direct.completions.create(model=SMOL, prompt="Hi", max_tokens=2)  # moves the counter

    def rejected() -> list[dict[str, Any]]:
        rows = fleet.central.get("/v1/telemetry/rows", table="mirror_rejects")["rows"]
        return [r for r in rows if r["box_id"] == box_id and r["source_id"] == str(bad_id)]

    found = until(rejected, "the hand-written row kept raw")
    assert "prompt_tokens" in found[0]["reason"] and json.loads(found[0]["raw"])["id"] == bad_id
    own = [r for r in box.calls() if r["id"] != bad_id]
    until(
        lambda: (
            {r["id"] for r in fleet.central.mirrored("call_log", box_id)} == {r["id"] for r in own}
        ),
        "the rest of the box's calls mirrored",
    )


def test_the_mirror_resumes_after_a_kill_9_of_the_central(fleet: Fleet) -> None:
    central = fleet.central
    with openai_client(fleet.boxes[0].url) as direct:
        direct.completions.create(model=SMOL, prompt="Hi", max_tokens=2)
        central.stop(signal.SIGKILL)  # mid-sync, as like as not
        for _ in range(3):
            direct.completions.create(model=SMOL, prompt="Hi", max_tokens=2)
    central.start()
    until(lambda: _all_up(central, fleet.ids), "the boxes followed again after the restart")
    for box, box_id in zip(fleet.boxes, fleet.ids, strict=True):
        until(
            lambda b=box, i=box_id: mirrored_exactly(central, b, i),  # type: ignore[misc]
            "every call row mirrored once after the restart",
        )


def test_a_central_on_postgresql_mirrors_a_box_s_calls_exactly_once(
    fleet: Fleet, postgres: PostgresCluster, tmp_path: Path
) -> None:
    """A second central, its store a PostgreSQL database, told of box a as a box's own
    registration tells it (from its host: no key): every call row once in its final form,
    also across a kill -9 of that central and while its database refuses it a while."""
    import psycopg

    home = tmp_path / "pg-central"
    home.mkdir()
    url = postgres.create_database()
    database = url.rsplit("/", 1)[1]
    central = Central(home, env={"FITBOX_CENTRAL_DB": url})
    box, box_id = fleet.boxes[0], fleet.ids[0]
    health = httpx.get(f"{box.url}/health", timeout=10).json()
    body = {
        "box_id": box_id,
        "name": health["name"],
        "version": health["version"],
        "url": box.url,
        "admin_key": Home(box.home).box_key.read_text().strip(),
    }
    central.start()
    try:
        assert "store: postgresql://fitbox:***@" in (home / "central.log").read_text()
        assert postgres.password not in (home / "central.log").read_text()
        assert httpx.post(f"{central.url}/v1/boxes", json=body, timeout=10).status_code == 201
        with openai_client(box.url) as direct:
            for _ in range(2):
                direct.completions.create(model=SMOL, prompt="Hi", max_tokens=2)
            until(lambda: mirrored_exactly(central, box, box_id), "every call row, once")
            central.stop(signal.SIGKILL)
            direct.completions.create(model=SMOL, prompt="Hi", max_tokens=2)
        central.start()  # the registration and the cursors were in the database
        until(lambda: mirrored_exactly(central, box, box_id), "every call row once, again")
        with psycopg.connect(postgres.url(), autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (database,),
            )
            with openai_client(box.url) as direct:
                direct.completions.create(model=SMOL, prompt="Hi", max_tokens=2)
            until(
                lambda: "not mirrored for now" in (home / "central.log").read_text(),
                "the central's mirror meeting its database gone",
            )
            admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
        until(lambda: mirrored_exactly(central, box, box_id), "every call row once, after")
    finally:
        central.stop()


def test_a_box_that_moves_port_reregisters_under_the_same_id(fleet: Fleet, tmp_path: Path) -> None:
    old = fleet.boxes[1]
    _stop_box(old)
    with openai_client(fleet.central.url) as client:
        client.models.list()  # the central still lists it while it is away
    moved = _join(old.home, fleet.models, fleet.central, fleet.worker_key)
    fleet.boxes[1] = moved
    assert moved.url != old.url and _box_id(moved) == fleet.ids[1]
    until(lambda: fleet.central.fleet()[fleet.ids[1]]["url"] == moved.url, "the new address")
    assert len(fleet.central.fleet()) == len(fleet.ids)
    until(
        lambda: mirrored_exactly(fleet.central, moved, fleet.ids[1]),
        "the moved box's rows, once each",
    )


def test_a_box_dead_before_the_first_byte_is_retried_on_the_next(fleet: Fleet) -> None:
    """The two lowest boxes hold the model and none is busy, so the bare name goes to the
    lowest id first: the test kills that box; the call is answered by the next (after a
    try on the dead one when the mirror has not seen it die yet; tests/test_fleet_routing.py
    holds that moment)."""
    with openai_client(fleet.boxes[1].url) as direct:
        direct.completions.create(model=SMOL, prompt="Hi", max_tokens=2)  # resident on both
    until(
        lambda: set(fleet.ids[:2]) <= set(_fleet_model(fleet.central, SMOL)["resident_on"]),
        "the model resident on the two boxes with the lowest ids",
    )
    first = min(fleet.ids)
    other = sorted(fleet.ids)[1]  # the next least busy
    _stop_box(fleet.boxes[fleet.ids.index(first)], signal.SIGKILL)
    with fleet.central.client() as client:
        raw = client.chat.completions.with_raw_response.create(
            model=SMOL, messages=HELLO, max_tokens=8
        )
        assert raw.headers["x-fitbox-box"] == other
        assert raw.headers.get("x-fitbox-retried-from", first).startswith(first)
        # once the central sees it unreachable, the box by name is a 503 to retry later
        until(lambda: _in_state(fleet.central, first, "unreachable"), "the dead box unreachable")
        with pytest.raises(openai.InternalServerError) as caught:
            client.chat.completions.create(model=f"{first}/{SMOL}", messages=HELLO)
    assert caught.value.status_code == 503
    assert caught.value.response.headers["x-should-retry"] == "true"
    assert isinstance(caught.value.body, dict) and "GET /v1/fleet" in caught.value.body["message"]
