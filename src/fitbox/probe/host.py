"""Host RAM, swap and cores, and how busy the CPUs are, read live.

psutil measures CPU use between two calls of the same kind: the first reading of a kind only
starts its clock (``start_cpu_counter`` for ``read_usage``; ``read_core_busy`` keeps its own).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import psutil


@dataclass(frozen=True)
class HostReading:
    mem_total: int
    mem_available: int  # MemAvailable on Linux
    swap_free: int
    physical_cores: int
    logical_cores: int


def read_host() -> HostReading:
    vm = psutil.virtual_memory()
    swap = psutil.swap_memory()
    logical = psutil.cpu_count(logical=True) or 1
    return HostReading(
        mem_total=vm.total,
        mem_available=vm.available,
        swap_free=swap.free,
        physical_cores=psutil.cpu_count(logical=False) or logical,
        logical_cores=logical,
    )


@dataclass(frozen=True)
class HostUsage:
    """One sensor reading of the host."""

    mem_total: int
    mem_available: int
    swap_free: int
    cpu_percent: float  # all CPUs, since the previous read_usage or start_cpu_counter


def start_cpu_counter() -> None:
    psutil.cpu_percent(None)


def read_usage() -> HostUsage:
    memory, swap = psutil.virtual_memory(), psutil.swap_memory()
    return HostUsage(
        mem_total=memory.total,
        mem_available=memory.available,
        swap_free=swap.free,
        cpu_percent=psutil.cpu_percent(None),
    )


def read_core_busy() -> list[float]:
    """Percent busy per logical CPU since the previous call: no sleep, so the call path may
    ask (all zero on the first call)."""
    return [float(p) for p in psutil.cpu_percent(percpu=True)]


class CoreBusyCounter:
    """Percent busy per logical CPU between two of *its own* reads (psutil's percpu counter
    is one per process, and GET /v1/cores reads it too). The first read is all zero."""

    def __init__(self) -> None:
        self._last: list[tuple[float, float]] | None = None

    def read(self) -> dict[int, float]:
        now = [(sum(t), t.idle + getattr(t, "iowait", 0.0)) for t in psutil.cpu_times(percpu=True)]
        last, self._last = self._last, now
        if last is None or len(last) != len(now):
            return {cpu: 0.0 for cpu in range(len(now))}
        busy = {}
        for cpu, ((total, idle), (was_total, was_idle)) in enumerate(zip(now, last, strict=True)):
            spent = total - was_total
            busy[cpu] = 0.0 if spent <= 0 else max(0.0, 100.0 * (1 - (idle - was_idle) / spent))
        return busy


def physical_cores() -> dict[int, frozenset[int]]:
    """Physical cores fitbox may use, numbered 0..n-1, each with its logical CPUs (SMT
    siblings share a core: a claim takes them together). Only CPUs in this process's
    affinity count; without topology files each logical CPU is its own core."""
    allowed = (
        sorted(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else list(range(os.cpu_count() or 1))
    )
    groups: dict[tuple[str, str], set[int]] = {}
    for cpu in allowed:
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            key = (
                (topology / "physical_package_id").read_text().strip(),
                (topology / "core_id").read_text().strip(),
            )
        except OSError:
            key = ("cpu", str(cpu))
        groups.setdefault(key, set()).add(cpu)
    ordered = sorted(groups.values(), key=min)
    return {i: frozenset(cpus) for i, cpus in enumerate(ordered)}
