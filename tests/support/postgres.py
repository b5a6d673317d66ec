"""A throwaway PostgreSQL cluster the tests (and bench/central.py) start themselves: Debian's
`postgresql` package, `initdb` into a temp dir and `pg_ctl start` on a free loopback port,
password (scram) auth over TCP as a real deployment has it, stopped and removed at the end.

initdb refuses to run as root, so as root the cluster is made and run by `nobody` (its
folder handed to it); as anyone else, by that user. .ci/run installs the package and sets
FITBOX_REQUIRE_TOOLS=1, so there a missing PostgreSQL fails the tests; elsewhere they skip
with the apt line (tests/support/tools.py's rule)."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

APT = "apt-get install -y postgresql"
SUPERUSER = "fitbox"
RUN_AS = "nobody"  # when the tests run as root
# a test cluster: nothing in it outlives the session, so durability buys nothing
FAST = ("-c", "fsync=off", "-c", "full_page_writes=off", "-c", "synchronous_commit=off")


def postgres_bin() -> Path | None:
    """The folder holding initdb and pg_ctl: Debian keeps them off PATH, per version."""

    def version(initdb: str) -> int:
        number = Path(initdb).parts[-3]
        return int(number) if number.isdigit() else 0

    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=version)
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("initdb")
    return Path(on_path).resolve().parent if on_path else None


def required_postgres() -> Path:
    found = postgres_bin()
    if found is not None and (found / "pg_ctl").exists():
        return found
    why = f"PostgreSQL (initdb, pg_ctl) is not installed: {APT}"
    if os.environ.get("FITBOX_REQUIRE_TOOLS"):
        pytest.fail(why)
    pytest.skip(why)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class PostgresCluster:
    root: Path
    bin: Path
    port: int
    password: str
    as_user: tuple[str, ...]  # the command prefix that runs a program as the cluster's owner

    @property
    def data(self) -> Path:
        return self.root / "data"

    def url(self, database: str = "postgres", password: str | None = None) -> str:
        secret = self.password if password is None else password
        return f"postgresql://{SUPERUSER}:{secret}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str | None = None) -> str:
        """A new, empty database; its URL."""
        import psycopg

        name = name or f"t_{secrets.token_hex(6)}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def _run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.as_user, *argv], capture_output=True, text=True, timeout=120, check=False
        )

    @classmethod
    def start(cls, durable: bool = False) -> PostgresCluster:
        """``durable``: PostgreSQL's own defaults (fsync on each commit), as a benchmark
        wants; tests run without fsync."""
        bin_dir = required_postgres()
        root = Path(tempfile.mkdtemp(prefix="fitbox-pg-"))
        as_user: tuple[str, ...] = ()
        if os.geteuid() == 0:
            owner = pwd.getpwnam(RUN_AS)
            os.chown(root, owner.pw_uid, owner.pw_gid)
            as_user = ("runuser", "-u", RUN_AS, "--")
        cluster = cls(root, bin_dir, 0, secrets.token_urlsafe(12), as_user)
        try:
            cluster._init()
            cluster._listen(durable)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _init(self) -> None:
        password_file = self.root / "pw"
        password_file.write_text(self.password + "\n")
        password_file.chmod(0o600)
        if self.as_user:
            owner = pwd.getpwnam(RUN_AS)
            os.chown(password_file, owner.pw_uid, owner.pw_gid)
        made = self._run(
            str(self.bin / "initdb"),
            "-D",
            str(self.data),
            "-U",
            SUPERUSER,
            f"--pwfile={password_file}",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "-N",
            "-E",
            "UTF8",
            "--locale=C",
        )
        password_file.unlink()
        if made.returncode != 0:
            raise RuntimeError(f"initdb failed:\n{made.stdout}{made.stderr}")

    def _listen(self, durable: bool) -> None:
        """On a free port; a port taken between the pick and the bind is another pick
        (the log says so), not a failed test."""
        log = self.root / "server.log"
        for _ in range(5):
            self.port = _free_port()
            started = self._start(durable)
            if started.returncode == 0:
                return
            text = log.read_text(errors="replace") if log.exists() else ""
            if "could not bind" not in text and "already in use" not in text:
                raise RuntimeError(f"PostgreSQL did not start:\n{started.stderr}{text}")
        raise RuntimeError("PostgreSQL found no free port in 5 tries")

    def _start(self, durable: bool = False) -> subprocess.CompletedProcess[str]:
        options = [
            "-k",
            str(self.root),
            "-c",
            "listen_addresses=127.0.0.1",
            "-p",
            str(self.port),
            *(() if durable else FAST),
        ]
        return self._run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.root / "server.log"),
            "-w",
            "-t",
            "60",
            "-o",
            " ".join(options),
            "start",
        )

    def halt(self) -> None:
        """The server stopped (an outage), its data kept: ``resume`` starts it again."""
        stopped = self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-w", "stop")
        if stopped.returncode != 0:
            raise RuntimeError(f"PostgreSQL did not stop:\n{stopped.stderr}")

    def resume(self) -> None:
        """The server started again after ``halt``, on its port (the URLs stand)."""
        started = self._start()
        if started.returncode != 0:
            raise RuntimeError(f"PostgreSQL did not start again:\n{started.stderr}")

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run(
                str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"
            )
        with contextlib.suppress(OSError):
            shutil.rmtree(self.root)
