"""The central and a box on real, non-loopback addresses: the box in a network namespace of
its own (``ip netns``, a veth pair), the central on the host's end of the pair. The box
registers with its own address and the central follows it across the link; a box bound to
loopback only is refused with the reason, by the box before it asks and by the central when
asked. Needs root and iproute2 (.ci/run runs as root): skipped with the reason elsewhere,
failed under FITBOX_REQUIRE_TOOLS=1."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from fitbox.central.store import CentralStore
from fitbox.cli.central import CENTRAL_SCOPES
from fitbox.store.keys import create_key

from .support.holds import Background, until
from .support.processes import answering_url
from .support.tools import required_tool


@dataclass(frozen=True)
class Link:
    namespace: str
    central_host: str  # the host's end of the veth pair
    box_host: str  # the namespace's end


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def link() -> Iterator[Link]:
    required_tool("ip", "iproute2")
    if os.geteuid() != 0:
        why = "network namespaces need root (ip netns add)"
        if os.environ.get("FITBOX_REQUIRE_TOOLS"):
            pytest.fail(why)
        pytest.skip(why)
    tag = os.getpid() % 250  # one pair per test process: runs side by side do not meet
    namespace, outer, inner = f"fbns{tag}", f"fbh{tag}", f"fbb{tag}"
    central_host, box_host = f"10.213.{tag}.1", f"10.213.{tag}.2"
    _ip("netns", "add", namespace)
    try:
        _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", namespace)
        _ip("addr", "add", f"{central_host}/30", "dev", outer)
        _ip("link", "set", outer, "up")
        for args in (
            ("addr", "add", f"{box_host}/30", "dev", inner),
            ("link", "set", inner, "up"),
            ("link", "set", "lo", "up"),
        ):
            _ip("netns", "exec", namespace, "ip", *args)
        yield Link(namespace, central_host, box_host)
    finally:
        subprocess.run(["ip", "link", "del", outer], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=30)


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
    link: Link, tmp_path: Path
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
            link.central_host,
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
        assert central_url.startswith(f"http://{link.central_host}:")
        in_namespace = ["ip", "netns", "exec", link.namespace, *fitbox, "serve"]
        joins = [f"--models={models}", f"--central={central_url}", f"--central-key={key}"]
        starting = [  # side by side: a start is mostly imports
            Background(
                lambda: _serve(
                    [
                        *in_namespace,
                        "--host",
                        link.box_host,
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

        seen = until(joined, "the box in its namespace registered and followed", within=60)
        assert seen["url"] == box_url and box_url.startswith(f"http://{link.box_host}:")
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
