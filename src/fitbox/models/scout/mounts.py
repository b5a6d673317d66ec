"""Mounted drives from ``/proc/self/mountinfo``: the ones worth a look, and the automount
points (autofs) that a look would wake (mount a network share, spin up a disk): never
entered.

The rule, in two parts. (1) A path the table names as an autofs mount point, or any path
below one (compared as written: resolving it would itself cross the point), is never
listed or looked up, mounted or not: listing a mounted one would hold it awake. (2) A
directory whose ``stat`` (which never triggers an automount: Linux's ``stat`` and ``lstat``
act as ``AT_NO_AUTOMOUNT``) reports an autofs device from the table is an automount point
with nothing mounted on it, however the path to it was spelled: it is never listed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")
# Filesystems that hold no one's model files
_PSEUDO = frozenset(
    {
        "proc",
        "sysfs",
        "devtmpfs",
        "devpts",
        "tmpfs",
        "cgroup",
        "cgroup2",
        "securityfs",
        "pstore",
        "bpf",
        "debugfs",
        "tracefs",
        "configfs",
        "fusectl",
        "mqueue",
        "hugetlbfs",
        "binfmt_misc",
        "rpc_pipefs",
        "nsfs",
        "overlay",
        "squashfs",
        "efivarfs",
        "ramfs",
        "autofs",
        "selinuxfs",
        "fuse.portal",
        "fuse.gvfsd-fuse",
    }
)
_SYSTEM = ("/proc", "/sys", "/dev", "/run", "/boot", "/snap")


@dataclass(frozen=True)
class Mount:
    point: Path
    fstype: str
    device: int | None = None  # st_dev of its root, from the table's MAJOR:MINOR


@dataclass(frozen=True)
class Automounts:
    """What the mount table says an automounter answers for."""

    points: frozenset[Path] = frozenset()
    devices: frozenset[int] = field(default_factory=frozenset)  # the autofs filesystems

    def point_over(self, path: Path) -> Path | None:
        """The automount point ``path`` is or lies under, as written (rule 1), if any."""
        normal = Path(os.path.normpath(os.path.abspath(path)))
        for point in (normal, *normal.parents):
            if point in self.points:
                return point
        return None

    def is_unmounted_point(self, st: os.stat_result) -> bool:
        """Whether a directory so stat'ed is an autofs directory: an automount point with
        nothing mounted on it yet (rule 2)."""
        return st.st_dev in self.devices


NO_AUTOMOUNTS = Automounts()


def _unescape(field: str) -> str:
    """mountinfo writes a space as \\040 (and tab, newline, backslash likewise)."""
    return (
        field.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
    )


def read_mounts(mountinfo: Path = MOUNTINFO) -> list[Mount]:
    try:
        text = mountinfo.read_text()
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, after = left.split(), right.split()
        if not sep or len(fields) < 5 or not after:
            continue
        found.append(Mount(Path(_unescape(fields[4])), after[0], _device(fields[2])))
    return found


def _device(field: str) -> int | None:
    major, sep, minor = field.partition(":")
    if not sep or not major.isdigit() or not minor.isdigit():
        return None
    return os.makedev(int(major), int(minor))


def automounts(mounts: list[Mount]) -> Automounts:
    """Mount points an automounter answers for (entering one mounts it), and their devices."""
    autofs = [m for m in mounts if m.fstype == "autofs"]
    return Automounts(
        frozenset(m.point for m in autofs),
        frozenset(m.device for m in autofs if m.device is not None),
    )


def drives(mounts: list[Mount]) -> list[Path]:
    """Mount points of real filesystems, outside the system's own trees."""
    seen: set[Path] = set()
    for m in mounts:
        if m.fstype in _PSEUDO or str(m.point).startswith(_SYSTEM) or m.point in seen:
            continue
        seen.add(m.point)
    return sorted(seen)
