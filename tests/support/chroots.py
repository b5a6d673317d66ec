"""Clean Debian trees for the package tests: debootstrapped once per release and kept as a
tarball under ~/.cache/fitbox-tests (CI keeps that cache), then untarred for each test into
a scratch root with /proc, /sys and /dev mounted, and always unmounted again.

The mirror is the one this machine's apt uses (its sources name deb.debian.org, reached
through whatever proxy apt is given), so a tree is built and later updated the same way."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

TREES = Path.home() / ".cache" / "fitbox-tests"
FALLBACK_MIRROR = "http://deb.debian.org/debian"


def apt_mirror(sources: Path = Path("/etc/apt/sources.list.d")) -> str:
    """The Debian archive this machine's apt uses (deb822 ``URIs:`` or one-line ``deb``),
    not its security archive."""
    texts = [p.read_text() for p in sorted(sources.glob("*.sources"))]
    texts += [p.read_text() for p in (Path("/etc/apt/sources.list"),) if p.is_file()]
    for text in texts:
        for found in re.findall(r"^(?:URIs:|deb)\s+(?:\[[^\]]*\]\s+)?(\S+)", text, re.M):
            uri = str(found).rstrip("/")
            if uri.endswith("/debian"):
                return uri
    return FALLBACK_MIRROR


def base_tarball(release: str) -> Path:
    """A minbase tree of ``release`` as a tarball, debootstrapped on first use (a few
    minutes, network); later calls only return its path."""
    arch = subprocess.run(
        ["dpkg", "--print-architecture"], capture_output=True, text=True, check=True
    ).stdout.strip()
    tarball = TREES / f"debootstrap-{release}-{arch}.tar.zst"
    TREES.mkdir(parents=True, exist_ok=True)
    with _locked(tarball.with_suffix(".lock")):
        if tarball.is_file():
            return tarball
        building = TREES / f"debootstrap-{release}-{arch}.building"
        shutil.rmtree(building, ignore_errors=True)
        try:
            subprocess.run(
                [
                    "debootstrap",
                    "--variant=minbase",
                    f"--arch={arch}",
                    release,
                    str(building),
                    apt_mirror(),
                ],
                check=True,
                capture_output=True,
                timeout=1800,
            )
            partial = tarball.with_suffix(".partial")
            subprocess.run(
                ["tar", "--zstd", "-C", str(building), "-cf", str(partial), "."],
                check=True,
                timeout=900,
            )
            os.rename(partial, tarball)  # a tarball cut off midway is never taken for one
        finally:
            shutil.rmtree(building, ignore_errors=True)
    return tarball


@contextlib.contextmanager
def clean_root(release: str, scratch: Path) -> Iterator[Path]:
    """A fresh ``release`` tree under ``scratch`` with /proc, /sys and /dev mounted, the
    host's resolver copied in and apt's downloads kept across runs (a cache folder per
    release bound on /var/cache/apt/archives); unmounted, its processes ended, however the
    test ends."""
    root = scratch / f"root-{release}"
    root.mkdir()
    subprocess.run(
        ["tar", "--zstd", "-C", str(root), "-xf", str(base_tarball(release))],
        check=True,
        timeout=900,
    )
    shutil.copy("/etc/resolv.conf", root / "etc" / "resolv.conf")
    downloads = TREES / f"apt-archives-{release}"
    (downloads / "partial").mkdir(parents=True, exist_ok=True)
    mounts = [
        (["-t", "proc", "proc"], root / "proc"),
        (["-t", "sysfs", "sysfs"], root / "sys"),
        (["--bind", "/dev"], root / "dev"),
        (["--bind", "/dev/pts"], root / "dev" / "pts"),
        (["--bind", str(downloads)], root / "var" / "cache" / "apt" / "archives"),
    ]
    mounted: list[Path] = []
    try:
        for args, target in mounts:
            subprocess.run(["mount", *args, str(target)], check=True)
            mounted.append(target)
        yield root
    finally:
        end_processes_in(root)
        for target in reversed(mounted):
            if subprocess.run(["umount", str(target)], capture_output=True).returncode:
                subprocess.run(["umount", "-l", str(target)], check=False)
        if not any(os.path.ismount(t) for t in mounted):
            shutil.rmtree(root, ignore_errors=True)


def end_processes_in(root: Path) -> None:
    """SIGKILL every process whose root is ``root`` (the test's own service and engines,
    should one outlive its stop), so the mounts can go."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if os.readlink(entry / "root") == str(root):
                os.kill(int(entry.name), 9)


def in_root(root: Path, *argv: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """``argv`` run inside ``root`` as root, with a plain environment."""
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "DEBIAN_FRONTEND": "noninteractive",
    }
    return subprocess.run(
        ["chroot", str(root), *argv], capture_output=True, text=True, timeout=timeout, env=env
    )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@contextlib.contextmanager
def booted(root: Path, log: Path) -> Iterator[int]:
    """``root`` booted by systemd-nspawn: its own systemd as PID 1, the host's network.
    Yields that init's pid (for ``inside``); powered off, or killed, however the test ends.
    The host's /proc, /sys and /dev that ``clean_root`` mounted are unmounted first: nspawn
    mounts the container's own."""
    for kernel in ("dev/pts", "dev", "sys", "proc"):
        if os.path.ismount(root / kernel):
            subprocess.run(["umount", str(root / kernel)], check=True)
    nspawn = ["systemd-nspawn", "-D", str(root), "--boot", "--register=no", "--keep-unit"]
    with log.open("wb") as out:
        proc = subprocess.Popen([*nspawn, "--console=passive"], stdout=out, stderr=out)
        try:
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
            while not children.read_text().split():
                assert proc.poll() is None, log.read_text()[-3000:]
                time.sleep(0.1)
            init = int(children.read_text().split()[0])
            # "running", or "degraded" where a unit the container cannot run failed: up
            inside(init, "systemctl", "is-system-running", "--wait", timeout=300)
            yield init
        finally:
            proc.terminate()  # nspawn powers the container off
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def inside(init: int, *argv: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """``argv`` in every namespace of the booted tree whose init is ``init``."""
    return subprocess.run(
        ["nsenter", "-t", str(init), "-a", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG": "C.UTF-8",
            "DEBIAN_FRONTEND": "noninteractive",
        },
    )
