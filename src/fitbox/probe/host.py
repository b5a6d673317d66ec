"""Host RAM and cores, read live."""

from __future__ import annotations

from dataclasses import dataclass

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
