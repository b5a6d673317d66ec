"""What the kernel says a thread may run on, read from /proc: the check the pinning tests
make against what fitbox set (fitbox itself only sets affinity, it never reads it back)."""

from __future__ import annotations

from pathlib import Path


def allowed_cpus(pid: int, tid: int) -> frozenset[int]:
    """The CPUs the kernel lets one thread run on, as /proc says (Cpus_allowed_list)."""
    status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
    listed = next(
        ln.split(":", 1)[1].strip()
        for ln in status.splitlines()
        if ln.startswith("Cpus_allowed_list:")
    )
    cpus: set[int] = set()
    for part in listed.split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return frozenset(cpus)
