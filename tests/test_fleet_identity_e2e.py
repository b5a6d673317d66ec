"""A box's identity at the central, with real processes on loopback: one `fitbox central
serve` and `fitbox serve` boxes joining it with a worker key. A call in flight on a box that
is killed reaches the central as interrupted once the box is back; a worker key and a known
box id are not enough to take that box over; a copy of a box's home joins as a box of its
own, the original untouched."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from .support.central import Central, worker_key
from .support.clients import openai_client
from .support.holds import HOLD_IDLE_TIMEOUT, Background, calls_on, engine_stopped, until
from .support.processes import FitboxProcess, start_fitbox, stop_fitbox

pytestmark = pytest.mark.engine
SMOL = "SmolLM2-135M-Instruct.Q4_1"


@dataclass
class Site:
    central: Central
    key: str
    models: Path


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, smollm2: Path) -> Iterator[Site]:
    central = Central(tmp_path_factory.mktemp("central"), env={"FITBOX_CENTRAL_LONG_POLL": "5"})
    key = worker_key(central.home)
    models = tmp_path_factory.mktemp("models")
    (models / smollm2.name).symlink_to(smollm2)
    central.start()
    try:
        yield Site(central, key, models)
    finally:
        central.stop()


def _join(site: Site, home: Path) -> FitboxProcess:
    return start_fitbox(
        home,
        [site.models],
        "--central",
        site.central.url,
        "--central-key",
        site.key,
        env=HOLD_IDLE_TIMEOUT,
    )


def _box_id(box: FitboxProcess) -> str:
    return str(httpx.get(f"{box.url}/health", timeout=10).json()["box_id"])


def _up_at(central: Central, box_id: str, url: str) -> bool:
    found = central.fleet().get(box_id, {})
    return found.get("state") == "up" and found.get("url") == url


def _kill(box: FitboxProcess) -> None:
    """SIGKILL the box and then its children (a stopped engine among them)."""
    children = psutil.Process(box.proc.pid).children(recursive=True)
    box.proc.kill()
    box.proc.wait()
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


@contextlib.contextmanager
def _joined(site: Site, home: Path) -> Iterator[FitboxProcess]:
    box = _join(site, home)
    try:
        yield box
    finally:
        if box.proc.poll() is None:
            stop_fitbox(box)


def _mirrored_call(central: Central, box_id: str, call_id: int) -> dict[str, Any] | None:
    rows = [r for r in central.mirrored("call_log", box_id) if r["id"] == call_id]
    return rows[0] if rows else None


def test_a_call_in_flight_on_a_killed_box_reaches_the_central_as_interrupted(
    site: Site, tmp_path: Path
) -> None:
    """The call is held by its stopped engine (SIGSTOP) until the central has mirrored it
    pending; the box is killed (SIGKILL) and started again on its home: its store closes
    the row as interrupted, and the central's copy follows."""
    home = tmp_path / "box"
    box = _join(site, home)
    try:
        box_id = _box_id(box)
        until(lambda: _up_at(site.central, box_id, box.url), "the box registered and up")
        with openai_client(box.url, max_retries=0) as direct:
            direct.completions.create(model=SMOL, prompt="Hi", max_tokens=2)  # loaded
            with engine_stopped(box, SMOL):

                def held_call() -> None:
                    with contextlib.suppress(Exception):  # its box is killed under it
                        direct.completions.create(model=SMOL, prompt="Hi", max_tokens=8)

                Background(held_call)
                until(lambda: calls_on(box, SMOL) == 1, "the call taken by the stopped engine")
                pending = until(
                    lambda: [
                        r
                        for r in site.central.mirrored("call_log", box_id)
                        if r["outcome"] == "pending"
                    ],
                    "the central's copy of the call, pending",
                )
                _kill(box)
    finally:
        if box.proc.poll() is None:
            _kill(box)
    call_id = int(pending[0]["id"])
    with _joined(site, home) as again:
        assert _box_id(again) == box_id
        row = until(
            lambda: (
                (found := _mirrored_call(site.central, box_id, call_id))
                and found["outcome"] == "interrupted"
                and found
            ),
            "the central's copy of the call, interrupted",
        )
        own = [r for r in again.calls() if r["id"] == call_id]
        assert own and own[0]["outcome"] == "interrupted"
        assert row["seq"] == own[0]["seq"]
