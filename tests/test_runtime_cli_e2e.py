"""The running box's own commands as an operator types them (`python -m fitbox ps|load|
unload|pin|unpin|logs|status`), against a real fitbox serving SmolLM2 on a real llama-server:
found through the home's endpoint file, a refusal exits 1 with the box's reason, no box
answering exits 3, and `logs -f` prints what the child writes after it started."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from .support.holds import until
from .support.processes import FitboxProcess, running_fitbox

pytestmark = pytest.mark.engine
SMOL = "SmolLM2-135M-Instruct.Q4_1"


def fitbox(box: FitboxProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fitbox", *args, "--home", str(box.home)],
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if k != "FITBOX_KEY"},  # none: the box itself
    )


def test_ps_load_pin_unload_status_and_a_refusal(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    with running_fitbox(tmp_path / "home", [smollm2.parent]) as box:
        empty = fitbox(box, "ps")
        assert empty.returncode == 0 and "(nothing resident)" in empty.stdout
        loaded = fitbox(box, "load", "smollm2")
        assert (loaded.returncode, loaded.stdout) == (0, "smollm2: load done\n"), loaded.stderr
        listed = fitbox(box, "ps")
        (header, row) = listed.stdout.splitlines()
        assert header.split() == ["MODEL", "STATE", "BYTES", "WHERE", "WINDOW", "IDLE", "CALLS"]
        assert row.split()[:2] == [SMOL, "ready"] and row.split()[-1] == "0"
        assert fitbox(box, "pin", "smollm2").returncode == 0
        as_json = json.loads(fitbox(box, "ps", "--json").stdout)
        assert as_json["data"][0]["pinned"] is True
        assert "ready pinned" in fitbox(box, "ps").stdout
        assert fitbox(box, "unpin", "smollm2").returncode == 0
        assert fitbox(box, "unload", "smollm2").returncode == 0
        assert httpx.get(f"{box.url}/v1/residents").json()["data"] == []
        status = fitbox(box, "status")
        assert status.returncode == 0, status.stdout
        assert status.stdout.startswith(f"fitbox {json_of(box)['version']} at {box.url}: ok")
        limited = httpx.post(f"{box.url}/v1/limits", json={"ram_max": "64MiB"})
        assert limited.status_code == 200
        refused = fitbox(box, "load", "smollm2")
        assert refused.returncode == 1 and refused.stdout == ""
        assert "fitbox: " in refused.stderr and "64.00 MiB" in refused.stderr, refused.stderr
        missing = fitbox(box, "unload", "no-such-model")
        assert missing.returncode == 1 and "no-such-model" in missing.stderr
    gone = fitbox(box, "ps", "--url", "http://127.0.0.1:9")  # nothing listens on port 9
    assert gone.returncode == 3 and "no fitbox answers at http://127.0.0.1:9" in gone.stderr


def json_of(box: FitboxProcess) -> dict[str, str]:
    found: dict[str, str] = httpx.get(f"{box.url}/health").json()
    return found


def test_logs_shows_the_child_s_log_and_follows_it(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    with running_fitbox(tmp_path / "home", [smollm2.parent]) as box:
        assert fitbox(box, "load", "smollm2").returncode == 0
        first = fitbox(box, "logs", "smollm2", "-n", "100000")
        assert first.returncode == 0 and first.stdout.startswith("$ ")
        assert "llama-server" in first.stdout.splitlines()[0]
        assert fitbox(box, "logs", "-n", "3").stdout.count("\n") == 3  # the newest log
        follower = subprocess.Popen(
            [sys.executable, "-m", "fitbox", "logs", "smollm2", "-f", "-n", "1"],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "FITBOX_HOME": str(box.home)},
        )
        seen: list[str] = []
        assert follower.stdout is not None
        lines = follower.stdout
        reader = threading.Thread(target=lambda: seen.extend(iter(lines.readline, "")))
        reader.start()
        try:
            until(lambda: seen or None, "the follower's first line")
            before = len(seen)
            body = {"model": "smollm2", "prompt": "Hi", "max_tokens": 2}
            assert httpx.post(f"{box.url}/v1/completions", json=body, timeout=60).is_success
            # the child logs each request it serves: the follower prints those lines
            until(lambda: len(seen) > before or None, "a line the child wrote after the call")
        finally:
            follower.terminate()
            follower.wait(30)
            reader.join(30)
            assert follower.stdout is not None
            follower.stdout.close()
