"""The central and a box on real, non-loopback addresses: the box in a network namespace of
its own (tests/support/netns.py: a veth pair to a bridge), the central on the bridge. The box
registers with its own address and the central follows it across the link; a box bound to
loopback only is refused with the reason, by the box before it asks and by the central when
asked. Needs root and iproute2 (the helper says what a machine without them is told)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fitbox.central.store import CentralStore
from fitbox.cli.central import CENTRAL_SCOPES
from fitbox.store.keys import create_key

from .support.holds import Background, until
from .support.netns import Network, network
from .support.processes import answering_url


@pytest.fixture(scope="module")
def net() -> Iterator[Network]:
    with network(["box"]) as made:
        yield made


def _serve(argv: list[str], home: Path, endpoint: str) -> tuple[subprocess.Popen[bytes], str]:
    home.mkdir(parents=True, exist_ok=True)
    log_path = home / "serve.log"
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        return proc, answering_url(proc, home / endpoint, log_path)
    except BaseException:
        proc.kill()
        proc.wait()
        raise


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_a_box_on_its_own_address_joins_and_a_loopback_one_is_refused(
    net: Network, tmp_path: Path
) -> None:
    fitbox = [sys.executable, "-m", "fitbox"]
    central_home, models = tmp_path / "central", tmp_path / "models"
    models.mkdir()
    central_home.mkdir()
    store = CentralStore(central_home / "central.sqlite3")
    try:  # one key registers the boxes and reads the fleet from off the host
        _, key = store.run(
            lambda conn: create_key(conn, "t", ("worker", "admin"), known=CENTRAL_SCOPES)
        )
    finally:
        store.close()
    admin = {"Authorization": f"Bearer {key}"}
    central, central_url = _serve(
        [
            *fitbox,
            "central",
            "serve",
            "--host",
            net.address,
            "--port",
            "auto",
            "--home",
            str(central_home),
        ],
        central_home,
        "central-endpoint.json",
    )
    procs = [central]
    try:
        assert central_url.startswith(f"http://{net.address}:")
        (space,) = net.namespaces
        in_namespace = [*space.wrap(), *fitbox, "serve"]
        joins = [f"--models={models}", f"--central={central_url}", f"--central-key={key}"]
        starting = [  # side by side: a start is mostly imports
            Background(
                lambda: _serve(
                    [
                        *in_namespace,
                        "--host",
                        space.address,
                        "--port",
                        "auto",
                        "--home",
                        str(tmp_path / "box"),
                        *joins,
                    ],
                    tmp_path / "box",
                    "endpoint.json",
                )
            ),
            Background(
                lambda: _serve(
                    [
                        *fitbox,
                        "serve",
                        "--host",
                        "127.0.0.1",
                        "--port",
                        "auto",
                        "--home",
                        str(tmp_path / "lo"),
                        *joins,
                    ],
                    tmp_path / "lo",
                    "endpoint.json",
                )
            ),
        ]
        for start in starting:
            with contextlib.suppress(Exception):  # one that failed is raised below
                procs.append(start.result()[0])
        box_url = starting[0].result()[1]
        box_id = httpx.get(f"{box_url}/health", timeout=10).json()["box_id"]

        def joined() -> dict[str, object] | None:
            fleet = httpx.get(f"{central_url}/v1/fleet", headers=admin, timeout=10).json()
            found = [b for b in fleet["data"] if b["box_id"] == box_id and b["state"] == "up"]
            return found[0] if found else None

        seen = until(joined, "the box in its namespace registered and followed")
        assert seen["url"] == box_url and box_url.startswith(f"http://{space.address}:")
        said = until(
            lambda: "loopback only" in (tmp_path / "lo" / "serve.log").read_text(),
            "the loopback box saying why it does not register",
        )
        assert said
        asked = httpx.post(
            f"{central_url}/v1/boxes",
            timeout=10,
            headers={"Authorization": f"Bearer {key}"},
            json={
                "box_id": "b0x",
                "name": "lo",
                "version": "0",
                "url": "http://127.0.0.1:8484",
                "admin_key": "k",
            },
        )
        assert asked.status_code == 400 and asked.json()["error"]["code"] == "box_unreachable"
        fleet = httpx.get(f"{central_url}/v1/fleet", headers=admin, timeout=10).json()["data"]
        assert [b["box_id"] for b in fleet] == [box_id]
    finally:
        for proc in reversed(procs):
            _stop(proc)
