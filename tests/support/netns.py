"""Boxes on machines of their own, as far as one host can make them: a network namespace per
box (``ip netns``), each joined to one bridge on the host by a veth pair, the central on the
bridge's own address. Each box runs in its namespace with a hostname of its own (a UTS
namespace: ``unshare --uts``), so the central sees three machines by name and address.

A link is cut by setting the host's end of its veth pair down: nothing crosses it either way
(the box still answers inside its namespace: ``Namespace.run`` is a client there), and it
comes back as it was when set up again.

Names are made from the test process's pid, so runs side by side do not meet; whatever an
earlier run of the same pid left is removed first, and everything made is removed on the
way out, also when a test fails (processes still in a namespace are killed: only the tests
start them). Needs root and iproute2 (.ci/run runs as root): skipped with the reason
elsewhere, failed under FITBOX_REQUIRE_TOOLS=1."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fitbox.home import Home

from .processes import FitboxProcess, start_fitbox
from .tools import required_tool

MAX_NAMESPACES = 200  # box addresses .10 … .209 of the bridge's /24


def _ip(*args: str) -> None:
    made = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if made.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {made.stderr.strip()}")


def _quietly(*args: str) -> None:
    subprocess.run(["ip", *args], capture_output=True, timeout=30)


@dataclass(frozen=True)
class Namespace:
    name: str  # the ip netns name
    address: str  # its own address on the bridge
    host_end: str  # the host's end of its veth pair: down cuts the link
    hostname: str

    def wrap(self) -> tuple[str, ...]:
        """A command prefix that runs a program in this namespace under its hostname; each
        step execs the next, so a Popen of it has the program's own pid (signals reach it)."""
        return (
            "ip",
            "netns",
            "exec",
            self.name,
            "unshare",
            "--uts",
            "--",
            "sh",
            "-c",
            'hostname "$0" && exec "$@"',
            self.hostname,
        )

    def run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """``argv`` run to its end in this namespace."""
        return subprocess.run(
            [*self.wrap(), *argv], capture_output=True, text=True, timeout=timeout
        )

    def python(self, code: str, timeout: float = 60) -> str:
        """``code`` run by this interpreter in the namespace (a client on that machine);
        its stdout, or a failure with what it printed."""
        done = self.run(sys.executable, "-c", code, timeout=timeout)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def cut(self) -> None:
        _ip("link", "set", self.host_end, "down")

    def mend(self) -> None:
        _ip("link", "set", self.host_end, "up")

    @contextlib.contextmanager
    def link_cut(self) -> Iterator[None]:
        """The namespace cut off for the block, its link up again after it."""
        self.cut()
        try:
            yield
        finally:
            self.mend()

    def kill_all(self) -> None:
        """Every process still in the namespace (the tests' own), SIGKILLed."""
        found = subprocess.run(
            ["ip", "netns", "pids", self.name], capture_output=True, text=True, timeout=30
        )
        for pid in found.stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)


@dataclass(frozen=True)
class Network:
    bridge: str
    address: str  # the host's address on the bridge: where a central listens
    namespaces: tuple[Namespace, ...]


def _require_root() -> None:
    required_tool("ip", "iproute2")
    required_tool("unshare", "util-linux")
    if os.geteuid() != 0:
        why = "network namespaces need root (ip netns add)"
        if os.environ.get("FITBOX_REQUIRE_TOOLS"):
            pytest.fail(why)
        pytest.skip(why)


@contextlib.contextmanager
def network(hostnames: list[str]) -> Iterator[Network]:
    """One namespace per name in ``hostnames`` on a bridge of the host; removed on exit."""
    _require_root()
    assert 0 < len(hostnames) <= MAX_NAMESPACES
    tag = os.getpid() % 250  # one network per test process: runs side by side do not meet
    bridge, subnet = f"fbbr{tag}", f"10.214.{tag}"
    spaces = tuple(
        Namespace(f"fbns{tag}x{i}", f"{subnet}.{10 + i}", f"fbh{tag}x{i}", hostname)
        for i, hostname in enumerate(hostnames)
    )
    made = Network(bridge, f"{subnet}.1", spaces)
    _remove(made)  # what an earlier run with this pid left behind
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"{made.address}/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for space in spaces:
            inner = f"fbv{tag}x{spaces.index(space)}"
            _ip("netns", "add", space.name)
            _ip("link", "add", space.host_end, "type", "veth", "peer", "name", inner)
            _ip("link", "set", inner, "netns", space.name)
            _ip("link", "set", space.host_end, "master", bridge)
            _ip("link", "set", space.host_end, "up")
            _ip("-n", space.name, "addr", "add", f"{space.address}/24", "dev", inner)
            _ip("-n", space.name, "link", "set", inner, "up")
            _ip("-n", space.name, "link", "set", "lo", "up")
        yield made
    finally:
        _remove(made)


def _remove(made: Network) -> None:
    for space in made.namespaces:
        space.kill_all()
        _quietly("link", "del", space.host_end)  # its peer goes with it
        _quietly("netns", "del", space.name)
    _quietly("link", "del", made.bridge)


def start_box_in(
    space: Namespace,
    home: Path,
    models: list[Path],
    *extra: str,
    env: dict[str, str] | None = None,
) -> FitboxProcess:
    """A real `fitbox serve` in ``space`` on its own address, asked by the tests (from the
    host: not the box itself) with its admin key, the box key it writes at its first start."""
    box = start_fitbox(home, models, "--host", space.address, *extra, env=env, wrap=space.wrap())
    box.headers["Authorization"] = f"Bearer {Home(home).box_key.read_text().strip()}"
    return box
