"""`fitbox install` / `uninstall` / `engines` as a user runs them, in a scratch HOME (user
installs) or a scratch root (system installs). systemd is not PID 1 here: units are
checked with systemd-analyze and enabled with systemctl --root; the unit's own ExecStart
is run by hand and must answer /health."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest


def fitbox(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "HOME": str(home)}  # no XDG_*: all under this HOME
    if "PYTHONPATH" in os.environ:  # the fitbox under test (a worktree's src), not another
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return subprocess.run(
        [sys.executable, "-m", "fitbox", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else b""
        for p in sorted(root.rglob("*"))
    }


def user_files(home: Path) -> tuple[Path, Path, Path]:
    return (
        home / ".config" / "fitbox" / "fitbox.env",
        home / ".config" / "systemd" / "user" / "fitbox.service",
        home / ".local" / "share" / "fitbox" / "box.key",
    )


def env_of(path: Path) -> dict[str, str]:
    pairs = (ln.split("=", 1) for ln in path.read_text().splitlines() if "=" in ln)
    return {k: v for k, v in pairs if not k.startswith("#")}


def test_a_dry_run_changes_nothing(tmp_path: Path) -> None:
    before = tree(tmp_path)
    result = fitbox(tmp_path, "install", "--user", "--port", "auto", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "would write" in result.stdout and tree(tmp_path) == before


def test_no_port_is_assumed(tmp_path: Path) -> None:
    result = fitbox(tmp_path, "install", "--user", "--yes")
    assert result.returncode == 1 and "no port is assumed" in result.stderr


def test_a_re_run_keeps_host_port_and_key(tmp_path: Path) -> None:
    first = fitbox(tmp_path, "install", "--user", "--port", "auto", "--yes")
    assert first.returncode == 0, first.stderr
    env_file, unit, key = user_files(tmp_path)
    for secret in (env_file, key):
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    before, key_before = env_of(env_file), key.read_text()
    assert "not started" in first.stdout  # systemd is not running here: said, not faked
    assert "engine: /" in first.stderr and "llama-server" in first.stderr  # it resolves
    again = fitbox(tmp_path, "install", "--user", "--yes", "--env", "FITBOX_CTX=2048")
    assert again.returncode == 0, again.stderr
    after = env_of(env_file)
    assert after["FITBOX_PORT"] == before["FITBOX_PORT"] and after["FITBOX_HOST"] == "127.0.0.1"
    assert after["FITBOX_CTX"] == "2048" and key.read_text() == key_before
    assert f"EnvironmentFile={env_file}" in unit.read_text()
    too_much = fitbox(tmp_path, "install", "--user", "--yes", "--ram-max", "64TiB")
    assert too_much.returncode == 1 and "ram: the box setting" in too_much.stderr
    assert "above what the device has" in too_much.stderr
    for flag, value in (("--cpu-max", "100000"), ("--storage-max", "100000TiB")):
        refused = fitbox(tmp_path, "install", "--user", "--yes", flag, value)
        assert refused.returncode == 1 and "above what the device has" in refused.stderr
    no_gpu = fitbox(tmp_path, "install", "--user", "--yes", "--vram-max", "8GiB")
    assert no_gpu.returncode == 1 and "this box has no GPU" in no_gpu.stderr
    capped = fitbox(tmp_path, "install", "--user", "--yes", "--cpu-max", "1", "--ram-max", "1GiB")
    assert capped.returncode == 0, capped.stderr
    assert env_of(env_file)["FITBOX_CPU_MAX"] == "1"
    assert env_of(env_file)["FITBOX_RAM_MAX"] == str(1 << 30)


def test_a_central_that_is_missing_never_fails_the_install(tmp_path: Path) -> None:
    """The install checks the central answers and leaves the registering to the service
    (with its box id, at every start); a central gone or a stranger never fails it."""
    import http.server
    import threading

    answers = {"/health": b'{"service": "fitbox-central", "status": "ok"}'}

    class Central(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = answers.get(self.path)
            self.send_response(200 if body else 404)
            self.end_headers()
            self.wfile.write(body or b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Central)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    central = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        ok = fitbox(
            tmp_path,
            "install",
            "--user",
            "--port",
            "auto",
            "--yes",
            "--central",
            central,
            "--central-key",
            "good",
        )
        assert ok.returncode == 0 and f"the central at {central} answers" in ok.stdout
        assert env_of(user_files(tmp_path)[0])["FITBOX_CENTRAL_KEY"] == "good"
        answers["/health"] = b'{"service": "something else"}'
        stranger = fitbox(tmp_path, "install", "--user", "--yes", "--central", central)
        assert stranger.returncode == 0 and "does not answer as a fitbox central" in stranger.stdout
        gone = fitbox(tmp_path, "install", "--user", "--yes", "--central", "http://127.0.0.1:9")
        assert gone.returncode == 0 and "could not be reached" in gone.stdout
    finally:
        server.shutdown()
        server.server_close()
    env_file, _, _ = user_files(tmp_path)
    assert env_of(env_file)["FITBOX_CENTRAL_URL"] == "http://127.0.0.1:9"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600  # the central key is in it


def test_the_units_verify_and_enable(tmp_path: Path) -> None:
    analyze, systemctl = shutil.which("systemd-analyze"), shutil.which("systemctl")
    assert analyze and systemctl, "systemd-analyze and systemctl are needed to check units"
    root = tmp_path / "root"
    installed = fitbox(
        tmp_path, "install", "--system", "--root", str(root), "--port", "8321", "--yes"
    )
    assert installed.returncode == 0, installed.stderr
    unit = root / "etc" / "systemd" / "system" / "fitbox.service"
    text = unit.read_text()
    for hardening in (
        "User=fitbox",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "StateDirectory=fitbox",
        "Restart=on-failure",
        "StartLimitBurst=5",
        "LimitNOFILE=65536",
    ):
        assert hardening in text
    assert "EnvironmentFile=/etc/fitbox/fitbox.env" in text  # real paths, not the scratch root
    verify = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True)
    assert verify.returncode == 0, verify.stderr
    enabled = subprocess.run(
        [systemctl, f"--root={root}", "enable", "fitbox.service"], capture_output=True, text=True
    )
    assert enabled.returncode == 0, enabled.stderr
    assert (root / "etc/systemd/system/multi-user.target.wants/fitbox.service").is_symlink()


def test_the_units_exec_start_serves(tmp_path: Path) -> None:
    assert fitbox(tmp_path, "install", "--user", "--port", "auto", "--yes").returncode == 0
    env_file, unit, _ = user_files(tmp_path)
    line = next(ln for ln in unit.read_text().splitlines() if ln.startswith("ExecStart="))
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), **env_of(env_file)}
    proc = subprocess.Popen(
        shlex.split(line.removeprefix("ExecStart=")),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://{env['FITBOX_HOST']}:{env['FITBOX_PORT']}"
        deadline, status = time.monotonic() + 60, None
        while time.monotonic() < deadline and status != 200:
            try:
                status = httpx.get(f"{url}/health", timeout=2).status_code
            except httpx.HTTPError:
                time.sleep(0.1)
        assert status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def test_uninstall_keeps_the_models_and_purge_takes_the_state(tmp_path: Path) -> None:
    assert fitbox(tmp_path, "install", "--user", "--port", "auto", "--yes").returncode == 0
    env_file, unit, key = user_files(tmp_path)
    model = tmp_path / ".local" / "share" / "fitbox" / "models" / "kept.gguf"
    model.write_bytes(b"GGUF")
    removed = fitbox(tmp_path, "uninstall", "--user", "--yes")
    assert removed.returncode == 0 and not unit.exists() and not env_file.exists()
    assert key.exists()  # plain uninstall keeps state
    purged = fitbox(tmp_path, "uninstall", "--user", "--purge", "--yes")
    assert purged.returncode == 0 and not key.exists() and model.read_bytes() == b"GGUF"


@pytest.mark.engine
def test_engines_lists_the_candidates_and_the_choice(
    tmp_path: Path, llama_server_bin: Path
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "fitbox", "engines"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    chosen = [ln for ln in result.stdout.splitlines() if ln.startswith("*")]
    assert len(chosen) == 1 and str(llama_server_bin) in chosen[0] and "--fit yes" in chosen[0]


def test_the_central_role_installs_its_own_service_beside_a_box(tmp_path: Path) -> None:
    assert fitbox(tmp_path, "install", "--user", "--port", "auto", "--yes").returncode == 0
    box_env, box_unit, _ = user_files(tmp_path)
    box_before = env_of(box_env)
    installed = fitbox(tmp_path, "install", "--user", "--central-role", "--port", "auto", "--yes")
    assert installed.returncode == 0, installed.stderr
    assert "fitbox central keys create --scope worker" in installed.stdout
    env_file = tmp_path / ".config" / "fitbox" / "fitbox-central.env"
    unit = tmp_path / ".config" / "systemd" / "user" / "fitbox-central.service"
    home = tmp_path / ".local" / "share" / "fitbox" / "central"
    env = env_of(env_file)
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert env["FITBOX_HOME"] == str(home) and (home / "central.sqlite3").is_file()
    assert stat.S_IMODE(home.stat().st_mode) == 0o700  # the store holds each box's admin key
    assert env_of(box_env) == box_before and env["FITBOX_PORT"] != box_before["FITBOX_PORT"]
    text = unit.read_text()
    assert f"EnvironmentFile={env_file}" in text and "-m fitbox central serve" in text
    again = fitbox(tmp_path, "install", "--user", "--central-role", "--yes")
    assert again.returncode == 0 and env_of(env_file)["FITBOX_PORT"] == env["FITBOX_PORT"]
    refused = fitbox(tmp_path, "install", "--user", "--central-role", "--yes", "--ram-max", "1GiB")
    assert refused.returncode == 1 and "a box's setting, not the central's" in refused.stderr
    line = next(ln for ln in text.splitlines() if ln.startswith("ExecStart="))
    run_env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        **env,
        **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"},
    }
    proc = subprocess.Popen(
        shlex.split(line.removeprefix("ExecStart=")),
        env=run_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://{env['FITBOX_HOST']}:{env['FITBOX_PORT']}"
        deadline, answer = time.monotonic() + 60, None
        while time.monotonic() < deadline and answer is None:
            try:
                answer = httpx.get(f"{url}/health", timeout=2).json()
            except httpx.HTTPError:
                time.sleep(0.1)
        assert answer is not None and answer["service"] == "fitbox-central"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    purged = fitbox(tmp_path, "uninstall", "--user", "--central-role", "--purge", "--yes")
    assert purged.returncode == 0 and not unit.exists() and not env_file.exists()
    assert not home.exists() and box_unit.exists() and box_env.exists()  # the box's stay


def test_the_central_s_system_unit_verifies(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is needed to check units"
    root = tmp_path / "root"
    installed = fitbox(
        tmp_path,
        "install",
        "--system",
        "--central-role",
        "--root",
        str(root),
        "--port",
        "8322",
        "--yes",
    )
    assert installed.returncode == 0, installed.stderr
    unit = root / "etc" / "systemd" / "system" / "fitbox-central.service"
    text = unit.read_text()
    for line in (
        "User=fitbox",
        "StateDirectory=fitbox-central",
        "ProtectSystem=strict",
        "EnvironmentFile=/etc/fitbox/fitbox-central.env",
        "LimitNOFILE=65536",
    ):
        assert line in text
    assert "CacheDirectory" not in text  # the central keeps no cache
    assert env_of(root / "etc/fitbox/fitbox-central.env")["FITBOX_HOME"] == (
        "/var/lib/fitbox-central"
    )
    verify = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True)
    assert verify.returncode == 0, verify.stderr


def test_the_socket_unit_holds_the_port_and_a_reload_re_executes(tmp_path: Path) -> None:
    """fitbox.socket beside fitbox.service: systemd holds the install's port (socket
    activation), the service requires it and reloads with SIGHUP (cli/serve.py)."""
    analyze, systemctl = shutil.which("systemd-analyze"), shutil.which("systemctl")
    assert analyze and systemctl, "systemd-analyze and systemctl are needed to check units"
    root = tmp_path / "root"
    installed = fitbox(
        tmp_path, "install", "--system", "--root", str(root), "--port", "8321", "--yes"
    )
    assert installed.returncode == 0, installed.stderr
    units = root / "etc" / "systemd" / "system"
    service, socket = (units / "fitbox.service").read_text(), units / "fitbox.socket"
    assert "ListenStream=127.0.0.1:8321" in socket.read_text().splitlines()
    for line in ("Requires=fitbox.socket", "After=fitbox.socket"):
        assert line in service.splitlines()
    assert "ExecReload=/bin/kill -HUP $MAINPID" in service.splitlines()
    verify = subprocess.run(
        [analyze, "verify", str(units / "fitbox.service"), str(socket)],
        capture_output=True,
        text=True,
    )
    assert verify.returncode == 0, verify.stderr
    enabled = subprocess.run(
        [systemctl, f"--root={root}", "enable", "fitbox.socket"], capture_output=True, text=True
    )
    assert enabled.returncode == 0, enabled.stderr
    assert (units / "sockets.target.wants" / "fitbox.socket").is_symlink()
    assert fitbox(tmp_path, "install", "--user", "--port", "auto", "--yes").returncode == 0
    user_socket = user_files(tmp_path)[1].with_suffix(".socket")
    assert user_socket.is_file()
    assert fitbox(tmp_path, "uninstall", "--user", "--yes").returncode == 0
    assert not user_socket.exists()
