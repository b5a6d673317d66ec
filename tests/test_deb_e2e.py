"""The .deb, for real: built with packaging/debian/build.py, installed with dpkg -i on this
machine (root; systemd is not PID 1 here, so postinst says the service is not started),
upgraded in place, its ExecStart run as the fitbox user, removed and purged."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from .support.paths import REPO
from .support.wheels import build_wheel

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0
    or shutil.which("dpkg") is None
    or subprocess.run(["dpkg", "-s", "fitbox"], capture_output=True).returncode == 0,
    reason="needs root and dpkg, and no fitbox package already installed",
)
VERSION = "0.1.0"


def dpkg(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["dpkg", *args], capture_output=True, text=True, timeout=900)


def mode(path: str) -> str:
    return subprocess.run(
        ["stat", "-c", "%a %U:%G", path], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_the_deb_installs_upgrades_serves_removes_and_purges(tmp_path: Path) -> None:
    wheel = build_wheel(VERSION, tmp_path)
    built = subprocess.run(
        [
            sys.executable,
            str(REPO / "packaging" / "debian" / "build.py"),
            "--out",
            str(tmp_path / "out"),
            "--wheel",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    deb = Path(built.stdout.strip().splitlines()[-1])
    assert deb.name == f"fitbox_{VERSION}_{dpkg('--print-architecture').stdout.strip()}.deb"
    created_state = not Path("/var/lib/fitbox").exists()
    try:
        first = dpkg("-i", str(deb))
        assert first.returncode == 0, first.stdout + first.stderr
        assert "systemd is not running" in first.stdout  # it copes, and says so
        assert os.access("/usr/bin/fitbox", os.X_OK)
        assert subprocess.run(["getent", "passwd", "fitbox"], capture_output=True).returncode == 0
        assert mode("/etc/fitbox/fitbox.env") == "600 root:root"
        assert mode("/var/lib/fitbox/box.key") == "600 fitbox:fitbox"
        assert mode("/var/lib/fitbox/fitbox.sqlite3") == "600 fitbox:fitbox"
        assert mode("/var/lib/fitbox") == "710 fitbox:fitbox"
        assert mode("/var/lib/fitbox/models") == "2770 fitbox:fitbox"
        env = dict(
            line.split("=", 1)
            for line in Path("/etc/fitbox/fitbox.env").read_text().splitlines()
            if "=" in line and not line.startswith("#")
        )
        # an upgrade (the same package again) keeps host, port and key
        key = Path("/var/lib/fitbox/box.key").read_text()
        again = dpkg("-i", str(deb))
        assert again.returncode == 0, again.stdout + again.stderr
        assert Path("/etc/fitbox/fitbox.env").read_text().count(f"FITBOX_PORT={env['FITBOX_PORT']}")
        assert Path("/var/lib/fitbox/box.key").read_text() == key
        # the unit's ExecStart, as the unit's user, serves
        unit = Path("/etc/systemd/system/fitbox.service").read_text()
        assert "ExecReload=/bin/kill -HUP $MAINPID" in unit  # a reload re-executes in place
        assert Path("/etc/systemd/system/fitbox.socket").is_file()
        exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
        assert exec_start == "ExecStart=/opt/fitbox/venv/bin/python -m fitbox serve"
        proc = subprocess.Popen(
            [
                "runuser",
                "-u",
                "fitbox",
                "--",
                "env",
                *(f"{k}={v}" for k, v in env.items()),
                *exec_start[len("ExecStart=") :].split(),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            url = f"http://{env['FITBOX_HOST']}:{env['FITBOX_PORT']}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    health = httpx.get(f"{url}/health", timeout=2).json()
                    break
                except httpx.HTTPError:
                    assert time.monotonic() < deadline and proc.poll() is None
                    time.sleep(0.2)
            assert health["version"] == VERSION
            _root_s_key_is_the_service_s(url)
        finally:
            proc.terminate()
            proc.wait(timeout=20)
        Path("/var/lib/fitbox/models/kept.gguf").write_bytes(b"GGUF")
        removed = dpkg("-r", "fitbox")
        assert removed.returncode == 0, removed.stdout + removed.stderr
        for gone in (
            "/opt/fitbox",
            "/etc/systemd/system/fitbox.service",
            "/etc/systemd/system/fitbox.socket",
            "/etc/fitbox/fitbox.env",
            "/usr/bin/fitbox",
        ):
            assert not Path(gone).exists(), gone
        assert Path("/var/lib/fitbox/fitbox.sqlite3").exists()  # remove keeps state
        purged = dpkg("-P", "fitbox")
        assert purged.returncode == 0, purged.stdout + purged.stderr
        assert subprocess.run(["getent", "passwd", "fitbox"], capture_output=True).returncode
        for gone in (
            "/etc/fitbox",
            "/var/cache/fitbox",
            "/var/lib/fitbox/fitbox.sqlite3",
            "/var/lib/fitbox/box.key",
        ):
            assert not Path(gone).exists(), gone
        assert Path("/var/lib/fitbox/models/kept.gguf").read_bytes() == b"GGUF"  # always kept
    finally:
        dpkg("-P", "fitbox")
        if created_state:
            shutil.rmtree("/var/lib/fitbox", ignore_errors=True)


def _root_s_key_is_the_service_s(url: str) -> None:
    """`sudo fitbox keys create` through /usr/bin/fitbox: the key lands in the service's own
    store (the env file's home, written as the service's user), so the service accepts it,
    and nothing in its home turns root's."""
    made = subprocess.run(
        ["/usr/bin/fitbox", "keys", "create", "--name", "ops", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"},
    )
    assert made.returncode == 0, made.stderr
    made_id = json.loads(made.stdout)["id"]
    listed = httpx.get(f"{url}/v1/keys").json()["data"]  # the service's own store's keys
    assert made_id in {k["id"] for k in listed}, listed
    owners = {
        mode(str(p)).split()[1] for p in Path("/var/lib/fitbox").iterdir() if p.name != "models"
    }
    assert owners == {"fitbox:fitbox"}, owners
