"""The hang watchdog against a real llama-server: a call queued for a slot inside a working
engine is not a hang, and one hang seen by many calls is one crash.

Holds are events the test controls: a SIGSTOP it sends, a stream it keeps open until it
has seen what it waits for, a file whose existence keeps ``/health`` unanswered (the
fronted fake, tests/fakes/fronted-llama-server, in front of the real engine). No test
waits for generation to be slower than a timeout.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from .support.holds import SAFETY_S, until
from .support.processes import FitboxProcess, running_fitbox

pytestmark = pytest.mark.engine
SMOL = "SmolLM2-135M-Instruct.Q4_1"
FRONTED = Path(__file__).parent / "fakes" / "fronted-llama-server"
HUNG = "hung: nothing for"


def chat(**extra: object) -> dict[str, object]:
    return {"model": SMOL, "messages": [{"role": "user", "content": "Tell me a story."}], **extra}


def engine_pids(box: FitboxProcess) -> list[int]:
    return sorted(p.pid for p in psutil.Process(box.proc.pid).children(recursive=True))


class Stream(threading.Thread):
    """One streamed call in a thread: its status and data events, as they come."""

    def __init__(self, box: FitboxProcess, body: dict[str, object]) -> None:
        super().__init__(daemon=True)
        self.url, self.body = f"{box.url}/v1/chat/completions", body
        self.status: int | None = None
        self.events: list[str] = []
        self.text = ""

    def run(self) -> None:
        with httpx.stream("POST", self.url, json=self.body, timeout=120) as response:
            self.status = response.status_code
            if response.status_code != 200:
                self.text = response.read().decode()
                return
            for line in response.iter_lines():
                if line.startswith("data: "):
                    self.events.append(line[6:])

    def error(self) -> dict[str, Any] | None:
        """The OpenAI error the call ended with: a body, or a stream's error event."""
        if self.text:
            error: dict[str, Any] = json.loads(self.text)["error"]
            return error
        for event in self.events:
            if event.startswith("{") and "error" in (parsed := json.loads(event)):
                return dict(parsed["error"])
        return None


def data_events(lines: Iterator[str], count: int) -> list[str]:
    events: list[str] = []
    for line in lines:
        if line.startswith("data: "):
            events.append(line[6:])
            if len(events) == count:
                break
    return events


def test_a_call_beyond_the_slots_waits_at_the_door_behind_a_working_engine_not_a_hang(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    """One slot, two streams: the second waits in fitbox's queue (a call beyond the slots
    never waits inside the engine) with no byte for longer than the idle bound, and
    /health goes unanswered all along (as llama-server's does under load). The engine is
    streaming to the first, so nothing is killed; the second gets the slot once the test
    ends the first."""
    silent = tmp_path / "health-silent"
    env = {
        "LLAMA_SERVER_BIN": str(FRONTED),
        "FAKE_REAL_BIN": str(llama_server_bin),
        "FAKE_SILENT_HEALTH": str(silent),
        "FITBOX_ENGINE_IDLE_TIMEOUT": "1",
        "FITBOX_PARALLEL": "1",
    }
    with running_fitbox(tmp_path / "home", [smollm2.parent], env=env) as box:
        warm = httpx.post(f"{box.url}/v1/chat/completions", json=chat(max_tokens=2), timeout=60)
        assert warm.status_code == 200, warm.text
        engines = engine_pids(box)
        silent.touch()  # from now on /health is never answered
        queued = Stream(box, chat(max_tokens=8, stream=True))
        body = chat(max_tokens=4000, stream=True, ignore_eos=True)
        with httpx.stream("POST", f"{box.url}/v1/chat/completions", json=body, timeout=60) as first:
            lines = first.iter_lines()
            assert len(data_events(lines, 3)) == 3
            queued.start()
            (waiting,) = until(
                lambda: httpx.get(f"{box.url}/v1/queue").json()["data"],
                "the second call waiting at fitbox's door",
            )
            assert waiting["blocked_by"] == [SMOL]
            since = time.monotonic()
            while time.monotonic() - since < 3:  # past the 1 s idle bound, at least
                assert len(data_events(lines, 1)) == 1, "the first stream ended first"
            assert HUNG not in box.log(), "the watchdog killed an engine that was streaming"
            more = data_events(lines, 5)
            assert len(more) == 5 and not any('"error"' in event for event in more)
            assert queued.events == []  # still waiting for the slot: not a byte yet
        # the test ended the first stream: the queued call gets the slot and its reply
        queued.join(timeout=SAFETY_S)
        assert queued.status == 200 and queued.error() is None, (queued.text, queued.events)
        assert queued.events[-1] == "[DONE]"
        assert engine_pids(box) == engines  # the same engine, never killed
        assert HUNG not in box.log()


def test_one_hang_seen_by_two_calls_is_one_crash(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    """Two calls on one engine (both its slots, streaming) find it silent after a SIGSTOP.
    One episode: one "hung" line, one crash. With a crash limit of two, a second count
    would mark the model failed and the next call would be refused. (Calls beyond the
    slots wait at fitbox's door, not in the engine: they are placed again once it is
    gone, so they are not part of the episode.)"""
    env = {
        "FITBOX_ENGINE_IDLE_TIMEOUT": "1",
        "FITBOX_STOP_GRACE": "1",
        "FITBOX_CRASH_LIMIT": "2",
        "FITBOX_PARALLEL": "2",
    }
    with running_fitbox(tmp_path / "home", [smollm2.parent], env=env) as box:
        warm = httpx.post(f"{box.url}/v1/chat/completions", json=chat(max_tokens=2), timeout=60)
        assert warm.status_code == 200, warm.text
        # two replies whose cells fit the 4096 window together (FORMULAS.md §KV cells): two
        # of 4000 tokens would wait for each other at the door
        streams = [
            Stream(box, chat(max_tokens=2000, stream=True, ignore_eos=True)) for _ in range(2)
        ]
        for stream in streams:
            stream.start()
        until(lambda: sum(bool(s.events) for s in streams) == 2, "the two slots streaming")
        stopped = engine_pids(box)
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        for stream in streams:
            stream.join(timeout=SAFETY_S)
        codes = [(s.status, (s.error() or {}).get("code")) for s in streams]
        assert all(code in ("engine_timeout", "engine_failed") for _, code in codes), codes
        assert box.log().count(HUNG) == 1, box.log()
        assert "marked failed" not in box.log()
        again = httpx.post(f"{box.url}/v1/chat/completions", json=chat(max_tokens=2), timeout=60)
        assert again.status_code == 200, again.text  # loaded again, not refused as failed
        assert not set(engine_pids(box)) & set(stopped)
        rows = box.calls()
        assert sorted(str(r["error_code"]) for r in rows[1:3]) == sorted(str(c) for _, c in codes)
