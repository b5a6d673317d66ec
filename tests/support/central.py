"""A real `fitbox central serve` for the fleet tests: its own home, a loopback port, and
what the tests ask of it (the fleet view, mirrored rows, a worker key)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil

from .clients import openai_client
from .processes import FitboxProcess, answering_url

CENTRAL = (sys.executable, "-m", "fitbox", "central")


@dataclass
class Central:
    home: Path
    proc: subprocess.Popen[bytes] | None = None
    url: str = ""
    env: dict[str, str] = field(default_factory=dict)  # FITBOX_CENTRAL_DB for PostgreSQL
    host: str = ""  # where it listens (a bridge's address, tests/support/netns.py): loopback

    def start(self) -> None:
        log_path = self.home / "central.log"
        argv = [
            sys.executable,
            "-m",
            "fitbox",
            "central",
            "serve",
            "--port",
            "auto",
            "--home",
            str(self.home),
            *(("--host", self.host) if self.host else ()),
        ]
        with log_path.open("ab") as log_file:
            self.proc = subprocess.Popen(
                argv, stdout=log_file, stderr=subprocess.STDOUT, env={**os.environ, **self.env}
            )
        self.url = answering_url(self.proc, self.home / "central-endpoint.json", log_path)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=20)

    def get(self, path: str, **params: Any) -> Any:
        response = httpx.get(f"{self.url}{path}", params=params, timeout=30)
        assert response.status_code == 200, response.text
        return response.json()

    def fleet(self) -> dict[str, dict[str, Any]]:
        return {b["box_id"]: b for b in self.get("/v1/fleet")["data"]}

    def mirrored(self, table: str, box_id: str) -> list[dict[str, Any]]:
        return list(self.get("/v1/telemetry/rows", table=table, box_id=box_id, limit=1000)["rows"])

    def client(self) -> openai.OpenAI:
        return openai_client(self.url, max_retries=0)


def worker_key(home: Path, scope: str = "worker", env: dict[str, str] | None = None) -> str:
    """A new key (a worker key unless ``scope`` says) of the central whose home is ``home``
    (its store need not be open); ``env``: the central's (FITBOX_CENTRAL_DB)."""
    made = subprocess.run(
        [*CENTRAL, "keys", "create", "--scope", scope, "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, **(env or {})},
    )
    return made.stdout.strip()


def up_at(central: Central, box_id: str, url: str) -> bool:
    """Whether the central shows ``box_id`` up at ``url``."""
    found = central.fleet().get(box_id, {})
    return found.get("state") == "up" and found.get("url") == url


def kill_box(box: FitboxProcess) -> None:
    """SIGKILL the box, then its children (a stopped engine among them)."""
    children = psutil.Process(box.proc.pid).children(recursive=True)
    box.proc.kill()
    box.proc.wait()
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


def mirrored_exactly(central: Central, box: FitboxProcess, box_id: str) -> bool:
    """The central holds every call row of the box once, each in its final form (a row it
    kept raw as a reject is in neither list)."""
    rejects = central.get("/v1/telemetry/rows", table="mirror_rejects")["rows"]
    kept_raw = {int(r["source_id"]) for r in rejects if r["box_id"] == box_id}
    own = {r["id"]: r for r in box.calls() if r["id"] not in kept_raw}
    theirs = central.mirrored("call_log", box_id)
    ids = [r["id"] for r in theirs]
    assert len(ids) == len(set(ids)), f"a row came twice: {ids}"
    assert all(r["box_id"] == box_id for r in theirs)
    return {r["id"]: (r["outcome"], r["seq"]) for r in theirs} == {
        i: (r["outcome"], r["seq"]) for i, r in own.items()
    }
