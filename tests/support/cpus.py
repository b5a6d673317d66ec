"""What the kernel says a thread may run on, read from /proc: the check the pinning tests
make against what fitbox set (fitbox itself only sets affinity, it never reads it back)."""

from __future__ import annotations

from pathlib import Path

from fitbox.box.sensors import BusyCores


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


def declare_load(busy: BusyCores, percent: float) -> None:
    """Sensor readings the test declares, as many in a row as make them count: every CPU
    ``percent`` busy with other work (our engines used none). 0: a box known quiet, which
    lends its reserved core to an engine alone; 100: every core kept busy by other work.
    The machine's real load plays no part."""
    cpus = {cpu for group in busy.cores.values() for cpu in group}
    for _ in range(busy.readings):
        busy.observe(dict.fromkeys(cpus, percent), set(), engines_percent=0.0)
