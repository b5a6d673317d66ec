"""A real fitbox on a real full drive (a 20 MB tmpfs each test mounts, ``drive``): a start
keeps an intact store whole and says why it cannot go on, and a running box keeps loading
models and answering, says it is degraded, refuses changes as data and records the calls it
answered once the drive has room again. fitbox's own output goes to a file off the drive."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from .support.processes import FitboxProcess, running_fitbox
from .support.small_drive import SmallDrive

pytestmark = pytest.mark.engine
SMOL = "SmolLM2-135M-Instruct.Q4_1"


def chat(box: FitboxProcess) -> httpx.Response:
    body = {"model": SMOL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return httpx.post(f"{box.url}/v1/chat/completions", json=body, timeout=120)


def serve_once(home: Path, models: Path) -> subprocess.CompletedProcess[str]:
    """`fitbox serve` expected to refuse to start: its exit and everything it printed."""
    argv = [
        sys.executable,
        "-m",
        "fitbox",
        "serve",
        "--port",
        "auto",
        "--home",
        str(home),
        "--models",
        str(models),
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def health_until(box: FitboxProcess, done: Any, bound_s: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + bound_s
    while True:
        health: dict[str, Any] = httpx.get(f"{box.url}/health", timeout=10).json()
        if done(health):
            return health
        assert time.monotonic() < deadline, health
        time.sleep(0.1)


def assert_refused_with_a_sentence(started: subprocess.CompletedProcess[str]) -> str:
    said = started.stdout + started.stderr
    assert started.returncode == 1, said
    assert "Traceback" not in said and "Application startup failed" not in said, said
    last = started.stderr.strip().splitlines()[-1]
    assert last.startswith("fitbox: cannot start: ") and "Nothing was moved" in last, said
    return last


def test_a_start_on_a_full_drive_keeps_every_key_and_call(
    tmp_path: Path, drive: SmallDrive, smollm2: Path, llama_server_bin: Path
) -> None:
    home = drive.path / "home"
    with running_fitbox(home, [smollm2.parent], log_path=tmp_path / "first.log") as box:
        made = httpx.post(f"{box.url}/v1/keys", json={"name": "mine", "scopes": ["admin"]})
        assert made.status_code == 201
        assert chat(box).status_code == 200
        before = [(c["request_id"], c["outcome"]) for c in box.calls()]
    assert [outcome for _, outcome in before] == ["ok"]
    drive.fill()
    last = assert_refused_with_a_sentence(serve_once(home, smollm2.parent))
    assert str(home / "fitbox.sqlite3") in last and "Free space there" in last
    assert not [p.name for p in home.iterdir() if "damaged" in p.name]
    drive.free()
    with running_fitbox(home, [smollm2.parent], log_path=tmp_path / "again.log") as again:
        mine = {"Authorization": f"Bearer {made.json()['key']}"}
        listed = httpx.get(f"{again.url}/v1/keys", headers=mine)
        assert listed.status_code == 200  # the key made before the full drive still works
        assert sorted(k["name"] for k in listed.json()["data"]) == ["box key", "mine"]
        assert [(c["request_id"], c["outcome"]) for c in again.calls()] == before
        health = httpx.get(f"{again.url}/health").json()
        assert health["status"] == "ok" and health["store"]["damaged_file_set_aside"] is None


def test_a_new_home_on_a_full_drive_fails_with_a_sentence(drive: SmallDrive, smollm2: Path) -> None:
    drive.fill()
    last = assert_refused_with_a_sentence(serve_once(drive.path / "new-home", smollm2.parent))
    assert "free" in last.lower()


def test_a_full_drive_loads_serves_and_records_the_calls_once_it_has_room(
    tmp_path: Path, drive: SmallDrive, smollm2: Path, llama_server_bin: Path
) -> None:
    log = tmp_path / "serve.log"
    with running_fitbox(drive.path / "home", [smollm2.parent], log_path=log) as box:
        drive.fill()
        filled_at, lines_before = time.monotonic(), len(log.read_text().splitlines())
        answered = []
        for _ in range(3):  # a failed mark takes three crashes: none of these may count
            answered.append(chat(box).status_code)
            httpx.post(f"{box.url}/v1/operator/unload", json={"model": SMOL}, timeout=30)
        health = health_until(box, lambda h: h["store"]["write_failures"] >= 20)
        refused = [
            httpx.post(f"{box.url}{path}", json=body)
            for path, body in (("/v1/keys", {"name": "k"}), ("/v1/settings/box", {"goal": "fast"}))
        ]
        errors = re.findall(
            r" ERROR fitbox\.store\.db: .*", "\n".join(log.read_text().splitlines()[lines_before:])
        )
        elapsed = time.monotonic() - filled_at
        drive.free()
        health_until(box, lambda h: h["status"] == "ok" and not h["store"].get("writes_waiting"))
        after = chat(box).status_code
        rows = [(c["endpoint"], c["outcome"]) for c in box.calls()]
        state = box.models()[SMOL]["state"]
        made = httpx.post(f"{box.url}/v1/keys", json={"name": "after"}).status_code
    assert answered == [200, 200, 200] and after == 200 and state != "failed"
    assert health["status"] == "degraded" and "is full" in health["problems"][0]
    for reply in refused:
        assert reply.status_code == 507, reply.text
        assert reply.json()["error"]["code"] == "storage_full"
        assert "Free space" in reply.json()["error"]["message"]
    assert 1 <= len(errors) <= 1 + int(elapsed // 60), errors  # a line a minute, not per write
    assert rows == [("/v1/chat/completions", "ok")] * 4  # the three while full landed later
    assert made == 201
