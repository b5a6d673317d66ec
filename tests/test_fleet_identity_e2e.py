"""A box's identity at the central, with real processes on loopback: one `fitbox central
serve` and `fitbox serve` boxes joining it with a worker key. A call in flight on a box that
is killed reaches the central as interrupted once the box is back; a worker key and a known
box id are not enough to take that box over; a copy of a box's home joins as a box of its
own, the original untouched."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from .support.central import CENTRAL, Central, kill_box, up_at, worker_key
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
        until(lambda: up_at(site.central, box_id, box.url), "the box registered and up")
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
                kill_box(box)
    finally:
        if box.proc.poll() is None:
            kill_box(box)
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


def test_a_box_restarted_elsewhere_with_its_secret_moves_and_a_borrowed_id_cannot(
    site: Site, tmp_path: Path
) -> None:
    """The box keeps the proof it was given at its first join (0600, beside its box key) and
    moves with it; the worker key and the box's public id alone are refused, the box left
    where it is."""
    home = tmp_path / "box"
    with _joined(site, home) as box:
        box_id = _box_id(box)
        until(lambda: up_at(site.central, box_id, box.url), "the box registered and up")
        health = httpx.get(f"{box.url}/health", timeout=10).json()
        thief = {
            "box_id": box_id,
            "name": health["name"],
            "version": health["version"],
            "url": "http://127.0.0.1:9",
            "admin_key": "fb_000000000000_" + "t" * 43,
        }
        auth = {"Authorization": f"Bearer {site.key}"}
        refused = httpx.post(f"{site.central.url}/v1/boxes", json=thief, headers=auth)
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["code"] == "box_identity_unproven"
        assert site.central.fleet()[box_id]["url"] == box.url
        secret = home / "central.secret"
        until(secret.is_file, "the box's proof kept in its home")
        assert secret.stat().st_mode & 0o777 == 0o600
        # with the secret too (a disk cloned whole): the box on record still answers as it
        twin = {**thief, "box_secret": secret.read_text().strip()}
        in_use = httpx.post(f"{site.central.url}/v1/boxes", json=twin, headers=auth)
        assert in_use.status_code == 409, in_use.text
        assert in_use.json()["error"]["code"] == "box_id_in_use"
        assert "systemd-machine-id-setup" in in_use.json()["error"]["message"]
        assert site.central.fleet()[box_id]["url"] == box.url
    with _joined(site, home) as moved:
        assert _box_id(moved) == box_id and moved.url != box.url
        until(lambda: up_at(site.central, box_id, moved.url), "the box followed at its new port")


def test_a_copy_of_a_box_s_home_joins_as_a_box_of_its_own(site: Site, tmp_path: Path) -> None:
    """A home copied (stopped, cp -a, as a cloned VM's disk) and served beside the original:
    the copy finds its id was made elsewhere, takes a new one and says why; the central
    lists both, each at its own address, each with its own calls."""
    home = tmp_path / "original"
    with _joined(site, home) as box:
        box_id = _box_id(box)
        until(lambda: up_at(site.central, box_id, box.url), "the original registered")
    copy_home = tmp_path / "copy"
    shutil.copytree(home, copy_home, symlinks=True)
    with _joined(site, home) as original, _joined(site, copy_home) as copy:
        copy_id = _box_id(copy)
        assert _box_id(original) == box_id and copy_id != box_id
        assert f"a copy of box {box_id}" in copy.log()
        until(lambda: up_at(site.central, box_id, original.url), "the original, where it is")
        until(lambda: up_at(site.central, copy_id, copy.url), "the copy, as itself")
        with openai_client(copy.url, max_retries=0) as direct:
            direct.completions.create(model=SMOL, prompt="Hi", max_tokens=2)
        (made,) = [r for r in copy.calls() if r["outcome"] == "ok"][-1:]
        until(
            lambda: _mirrored_call(site.central, copy_id, int(made["id"])),
            "the copy's call mirrored under the copy's id",
        )
        assert site.central.fleet()[box_id]["url"] == original.url
        said = (site.central.home / "central.log").read_text()
        assert f"Box {box_id} is registered" not in said and f"Box {copy_id}" not in said


def _boxes(site: Site, *argv: str) -> str:
    made = subprocess.run(
        [*CENTRAL, "boxes", *argv, "--home", str(site.central.home)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    return made.stdout


def test_a_person_drains_renames_and_removes_a_box_from_the_central_s_host(
    site: Site, tmp_path: Path
) -> None:
    """`fitbox central boxes` on the central's host (no key): a drained box takes no
    bare-name call (BOX/MODEL still reaches it), a renamed one is listed and named by its
    new name, a removed one is no longer followed."""
    with _joined(site, tmp_path / "box") as box:
        box_id = _box_id(box)
        until(lambda: up_at(site.central, box_id, box.url), "the box registered and up")
        for gone in set(site.central.fleet()) - {box_id}:  # the earlier tests' boxes
            assert f"removed {gone}" in _boxes(site, "remove", gone)
        assert list(site.central.fleet()) == [box_id] and box_id in _boxes(site, "list")
        until(lambda: SMOL in str(site.central.get("/v1/models")), "its models mirrored")
        _boxes(site, "drain", box_id)
        with site.central.client() as client:
            with pytest.raises(openai.NotFoundError, match="only on draining boxes"):
                client.completions.create(model=SMOL, prompt="Hi", max_tokens=2)
            _boxes(site, "rename", box_id, "rack-7")
            assert "rack-7" in _boxes(site, "list")
            named = client.completions.with_raw_response.create(
                model=f"rack-7/{SMOL}", prompt="Hi", max_tokens=2
            )
            assert named.headers["x-fitbox-box"] == box_id
            _boxes(site, "undrain", "rack-7")
            client.completions.create(model=SMOL, prompt="Hi", max_tokens=2)
        limited = subprocess.run(
            [*CENTRAL, "keys", "create", "--model", "tiny", "--home", str(site.central.home)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.strip()
        with openai_client(site.central.url, api_key=limited, max_retries=0) as client:
            assert [m.id for m in client.models.list()] == []  # SmolLM2 is not its to see
            with pytest.raises(openai.PermissionDeniedError, match="may not use"):
                client.completions.create(model=f"rack-7/{SMOL}", prompt="Hi", max_tokens=2)
        assert f"removed {box_id}" in _boxes(site, "remove", box_id)
        assert site.central.fleet() == {}
