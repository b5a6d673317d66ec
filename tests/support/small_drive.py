"""A real, small drive for full-disk tests: a tmpfs mounted for one test, filled to the last
byte by a file the test writes and freed by deleting it, unmounted at the end. Mounting
needs root (CAP_SYS_ADMIN); where that is refused the test is skipped with the reason, and
the store's writes are also covered by SQLITE_FULL injection (test_full_drive.py)."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SIZE = "20m"


@dataclass
class SmallDrive:
    path: Path

    @property
    def filler(self) -> Path:
        return self.path / "filler"

    def fill(self) -> None:
        """Write until the drive refuses one more byte (a whole page at the end)."""
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for chunk in (1 << 20, 4096, 1):
                block = b"\0" * chunk
                with contextlib.suppress(OSError):
                    while os.write(fd, block):
                        pass
        finally:
            os.close(fd)
        with pytest.raises(OSError) as refused:  # the drive is full for everyone now
            (self.path / "probe").write_bytes(b"x" * 4096)
        assert refused.value.errno == errno.ENOSPC
        (self.path / "probe").unlink(missing_ok=True)

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def free_bytes(self) -> int:
        return shutil.disk_usage(self.path).free


@contextlib.contextmanager
def small_drive(where: Path, fstype: str = "tmpfs") -> Iterator[SmallDrive]:
    """``fstype="ramfs"``: a drive with no size limit that refuses O_DIRECT (tmpfs takes it
    since Linux 6.6)."""
    where.mkdir(parents=True, exist_ok=True)
    options = f"size={SIZE},mode=0755" if fstype == "tmpfs" else "mode=0755"
    mounted = subprocess.run(
        ["mount", "-t", fstype, "-o", options, fstype, str(where)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(
            f"cannot mount a {fstype} here ({mounted.stderr.strip()}): full-disk tests "
            "need root; test_full_drive.py also covers writes by SQLITE_FULL injection"
        )
    try:
        yield SmallDrive(where)
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], check=True)  # a process still in it
