"""The change counter, long-polls and cursor replay, on a real fitbox process. No engine is
needed: a call for an unknown model is a call row too, written and updated as it moves."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from fitbox.store.keys import create_key

from .conftest import FitboxProcess, running_fitbox


def counter(box: FitboxProcess) -> int:
    value: int = httpx.get(f"{box.url}/v1/telemetry/state").json()["counter"]
    return value


def counter_reaches(box: FitboxProcess, expected: int, within: float = 10.0) -> int:
    """The counter once it shows ``expected`` (writes land a moment after the reply)."""
    deadline = time.monotonic() + within
    while (value := counter(box)) < expected and time.monotonic() < deadline:
        time.sleep(0.02)
    return value


def miss(box: FitboxProcess, i: int) -> None:
    reply = httpx.post(f"{box.url}/v1/completions", json={"model": f"nope-{i}", "prompt": "x"})
    assert reply.status_code == 404


def test_the_counter_moves_on_events_only(tmp_path: Path) -> None:
    with running_fitbox(tmp_path / "home", [tmp_path / "models"]) as box:
        start = counter(box)
        time.sleep(1.0)  # an idle box: nothing happens, nothing moves
        assert counter(box) == start
        httpx.post(f"{box.url}/v1/operator/refresh-models")
        after_action = counter_reaches(box, start + 1)
        assert after_action == start + 1
        miss(box, 0)
        assert counter_reaches(box, after_action + 2) == after_action + 2  # written, then done
        time.sleep(0.5)
        assert counter(box) == after_action + 2  # and nothing more after that


def test_a_long_poll_wakes_on_the_event_not_at_its_bound(tmp_path: Path) -> None:
    with running_fitbox(tmp_path / "home", [tmp_path / "models"]) as box:
        start = counter(box)
        answer: dict[str, Any] = {}

        def poll() -> None:
            began = time.monotonic()
            answer["body"] = httpx.get(
                f"{box.url}/v1/telemetry/state", params={"since": start, "wait": 30}, timeout=60
            ).json()
            answer["took"] = time.monotonic() - began  # fmt: skip

        poller = threading.Thread(target=poll)
        poller.start()
        time.sleep(0.3)
        assert poller.is_alive()  # nothing happened yet: still waiting
        httpx.post(f"{box.url}/v1/operator/refresh-models")
        poller.join(timeout=30)
        assert answer["body"]["counter"] > start and answer["took"] < 30
        print(f"long-poll answered {answer['took'] - 0.3:.3f} s after the event (upper bound)")


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
            seen += [(r["id"], r["seq"]) for r in page["rows"]]  # fmt: skip
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
        seen += [(r["id"], r["seq"]) for r in tail["rows"]]  # fmt: skip
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
