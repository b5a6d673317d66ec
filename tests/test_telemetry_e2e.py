"""The change counter, long-polls and cursor replay, on a real fitbox process. No engine is
needed: a call for an unknown model is a call row too, written and updated as it moves."""

from __future__ import annotations

import http.client
import json
import select
import signal
import sqlite3
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

import httpx

from fitbox.store.keys import create_key

from .support.holds import until
from .support.processes import FitboxProcess, running_fitbox


def counter(box: FitboxProcess) -> int:
    value: int = httpx.get(f"{box.url}/v1/telemetry/state").json()["counter"]
    return value


def counter_reaches(box: FitboxProcess, expected: int, within: float = 120.0) -> int:
    """The counter once it shows ``expected`` (writes land a moment after the reply)."""
    deadline = time.monotonic() + within
    while (value := counter(box)) < expected and time.monotonic() < deadline:
        time.sleep(0.02)
    return value


def miss(box: FitboxProcess, i: int) -> None:
    reply = httpx.post(f"{box.url}/v1/completions", json={"model": f"nope-{i}", "prompt": "x"})
    assert reply.status_code == 404


def replay(box: FitboxProcess, table: str, since: int = 0) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = httpx.get(
        f"{box.url}/v1/telemetry", params={"table": table, "since": since, "limit": 1000}
    ).json()["rows"]
    return rows


def test_the_counter_moves_on_events_only(tmp_path: Path) -> None:
    with running_fitbox(tmp_path / "home", [tmp_path / "models"]) as box:
        start = counter(box)
        mark = max((r["id"] for r in replay(box, "resource_log")), default=0)
        # an idle box: the sensors tick (readings are not events), nothing else happens
        until(
            lambda: len({r["at"] for r in replay(box, "resource_log", mark)}) >= 4,
            "four sensor ticks",
        )
        assert counter(box) == start
        httpx.post(f"{box.url}/v1/operator/refresh-models")
        after_action = counter_reaches(box, start + 1)
        assert after_action == start + 1
        miss(box, 0)
        assert counter_reaches(box, after_action + 2) == after_action + 2  # written, then done
        # and nothing more after that: the next event is the box's next action, and the
        # call's row still carries its second change
        httpx.post(f"{box.url}/v1/operator/refresh-models")
        actions = until(
            lambda: replay(box, "operator_actions", after_action)[-1:], "the second action's row"
        )
        assert actions[0]["seq"] == after_action + 3 == counter(box)
        (call,) = replay(box, "call_log")
        assert call["seq"] == after_action + 2


def test_a_long_poll_wakes_on_the_event_not_at_its_bound(tmp_path: Path) -> None:
    with running_fitbox(tmp_path / "home", [tmp_path / "models"]) as box:
        start = counter(box)
        url = urllib.parse.urlsplit(box.url)
        waiting = http.client.HTTPConnection(url.hostname or "", url.port, timeout=60)
        waiting.request("GET", f"/v1/telemetry/state?since={start}&wait=30")  # sent: it waits
        sent = time.monotonic()
        # a second long poll, sent after the first, answers at its own 1 s bound with nothing
        # new: the first was on the same loop before it, and nothing has woken it
        idle = httpx.get(
            f"{box.url}/v1/telemetry/state", params={"since": start, "wait": 1}, timeout=30
        ).json()
        assert idle["counter"] == start
        assert waiting.sock is not None
        assert not select.select([waiting.sock], [], [], 0)[0]  # no byte of an answer yet
        woke = time.monotonic()
        httpx.post(f"{box.url}/v1/operator/refresh-models")
        answer = json.loads(waiting.getresponse().read())
        answered = time.monotonic()
        waiting.close()
        assert answer["counter"] > start
        assert answer["changed"] == ["operator_actions"]  # a mirror replays that table only
        assert idle["changed"] == []
        assert answered - sent < 30  # before its bound: the event woke it
        print(f"long-poll answered {answered - woke:.3f} s after the event was asked for")


def test_a_stop_answers_an_open_long_poll_at_once(tmp_path: Path) -> None:
    """The poll is held by the box (a 60 s wait, nothing changing) and seen waiting before
    the stop; the stop must answer it, saying so: left to uvicorn, it would be cut off with
    no reply at the end of the grace period."""
    with running_fitbox(tmp_path / "home", [tmp_path / "models"]) as box:
        start = counter(box)
        url = urllib.parse.urlsplit(box.url)
        waiting = http.client.HTTPConnection(url.hostname or "", url.port, timeout=60)
        waiting.request("GET", f"/v1/telemetry/state?since={start}&wait=60")
        # answered after the first was taken in (same loop, sent later): the first waits
        idle = httpx.get(
            f"{box.url}/v1/telemetry/state", params={"since": start, "wait": 0}, timeout=30
        ).json()
        assert idle["stopping"] is False
        assert waiting.sock is not None and not select.select([waiting.sock], [], [], 0)[0]
        box.proc.send_signal(signal.SIGTERM)
        reply = waiting.getresponse()
        answer = json.loads(reply.read())
        waiting.close()
        assert reply.status == 200 and answer["stopping"] is True
        assert answer["counter"] >= start
        box.proc.wait(timeout=60)
        # uvicorn's word when it cuts open responses off at its grace period's end
        assert "timeout graceful shutdown exceeded" not in box.log_path.read_text()


def test_cursor_replay_yields_every_change_once_under_concurrent_writes(tmp_path: Path) -> None:
    with running_fitbox(tmp_path / "home", [tmp_path / "models"]) as box:
        start = counter(box)

        def write(k: int) -> None:
            for i in range(15):
                miss(box, k * 100 + i)

        writers = [threading.Thread(target=write, args=(k,)) for k in range(3)]
        for w in writers:
            w.start()
        seen: list[tuple[int, int]] = []
        cursor, middle = 0, None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            page = httpx.get(
                f"{box.url}/v1/telemetry", params={"table": "call_log", "since": cursor, "limit": 7}
            ).json()
            seen += [(r["id"], r["seq"]) for r in page["rows"]]
            cursor = page["next"]
            middle = middle or (cursor if len(seen) > 20 else None)
            if not page["rows"] and not any(w.is_alive() for w in writers):
                break
        for w in writers:
            w.join()
        counter_reaches(box, start + 45 * 2)  # every row written and finished
        tail = httpx.get(
            f"{box.url}/v1/telemetry", params={"table": "call_log", "since": cursor, "limit": 1000}
        ).json()
        seen += [(r["id"], r["seq"]) for r in tail["rows"]]
        seqs = [s for _, s in seen]
        assert seqs == sorted(set(seqs))  # every change once, in order
        with sqlite3.connect(box.home / "fitbox.sqlite3") as conn:
            final = dict(conn.execute("SELECT id, seq FROM call_log"))
        assert len(final) == 45 and {i for i, _ in seen} == set(final)
        last_seen = {}
        for row_id, seq in seen:
            last_seen[row_id] = seq
        assert last_seen == final  # the newest version of every row reached the mirror
        assert middle is not None
        resumed = httpx.get(
            f"{box.url}/v1/telemetry", params={"table": "call_log", "since": middle, "limit": 1000}
        ).json()
        assert [r["seq"] for r in resumed["rows"]] == [s for s in seqs if s > middle]


def test_telemetry_needs_the_read_scope_from_elsewhere(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with running_fitbox(home, [tmp_path / "models"]) as box:
        with sqlite3.connect(home / "fitbox.sqlite3") as conn:
            reader = create_key(conn, "mirror", ("read",))[1]
            caller = create_key(conn, "app", ("inference",))[1]
        state = f"{box.url}/v1/telemetry/state"
        assert httpx.get(state, headers={"Authorization": f"Bearer {reader}"}).status_code == 200
        assert httpx.get(state, headers={"Authorization": f"Bearer {caller}"}).status_code == 403
        bad = httpx.get(f"{box.url}/v1/telemetry", params={"table": "api_keys"})
        assert bad.status_code == 400 and "api_keys" not in bad.json()["error"]["message"][:20]


def test_a_long_poll_answer_carries_the_changed_rows_from_the_reader_s_cursors(
    tmp_path: Path,
) -> None:
    """A mirror gives its cursors with the long-poll: the answer carries each changed
    table's page from them (the rows a replay would return), one request a change."""
    with running_fitbox(tmp_path / "home", [tmp_path / "models"]) as box:
        start = counter(box)
        miss(box, 1)
        counter_reaches(box, start + 2)  # the call's row opened and finished
        state = httpx.get(
            f"{box.url}/v1/telemetry/state",
            params={"since": start, "wait": 5, "cursors": "call_log:0,children:0"},
        ).json()
        assert "call_log" in state["changed"] and "children" not in state["changed"]
        assert set(state["pages"]) == {"call_log"}  # only the tables that changed
        page = state["pages"]["call_log"]
        assert page["rows"] == replay(box, "call_log") and page["rows"]
        assert page["next"] == page["rows"][-1]["seq"] and page["cursor"] == "seq"
        plain = httpx.get(f"{box.url}/v1/telemetry/state", params={"since": start}).json()
        assert "pages" not in plain  # a reader that gives no cursors: the counter alone
        for bad in ("nope:1", "call_log:x", "call_log:\u00b2", f"call_log:{2**70}"):
            refused = httpx.get(f"{box.url}/v1/telemetry/state", params={"cursors": bad})
            assert refused.status_code == 400, refused.text
            error = refused.json()["error"]
            assert error["code"] == "invalid_request" and error["param"] == "cursors"
            assert "call_log" in error["message"]  # the tables it may name
