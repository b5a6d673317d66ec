"""Mounted drives from ``/proc/self/mountinfo``: the ones worth a look, and the automount
points (autofs) that a look would wake (mount a network share, spin up a disk): never
entered."""

from __future__ import annotations

from dataclasses import dataclass
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
        found.append(Mount(Path(_unescape(fields[4])), after[0]))
    return found


def automounts(mounts: list[Mount]) -> frozenset[Path]:
    """Mount points an automounter answers for: entering one mounts it."""
    return frozenset(m.point for m in mounts if m.fstype == "autofs")


def drives(mounts: list[Mount]) -> list[Path]:
    """Mount points of real filesystems, outside the system's own trees."""
    seen: set[Path] = set()
    for m in mounts:
        if m.fstype in _PSEUDO or str(m.point).startswith(_SYSTEM) or m.point in seen:
            continue
        seen.add(m.point)
    return sorted(seen)
