"""The box's capacity tiers, read from the probes and the settings (core/tiers.py's rules).

device >= box setting (--ram-max, --vram-max, --cpu-max, --storage-max, or POST /v1/limits)
>= central setting (POST /v1/limits {"tier": "central", ...}: what a central allots the box,
through the central's POST /v1/fleet/boxes/{id}/limits).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from fitbox.core.claims import claimable_count
from fitbox.core.tiers import Tier
from fitbox.probe.disk import storage_total
from fitbox.probe.gpus import GpuReading
from fitbox.probe.host import HostReading, physical_cores, read_host

Limit = Callable[[str], Any]


def no_limit(name: str) -> Any:
    return None


def tiers(
    limit: Limit,
    host: HostReading,
    gpus: list[GpuReading],
    claimable_cores: int,
    storage: int = 0,
    central: Limit = no_limit,
) -> list[Tier]:
    found = [Tier("ram", host.mem_total, limit("ram_max"), central("ram_max"))]
    found += [
        Tier(f"vram:gpu{g.index}", g.total, limit("vram_max"), central("vram_max")) for g in gpus
    ]
    found.append(Tier("cores", claimable_cores, limit("cpu_max"), central("cpu_max")))
    if storage:
        found.append(Tier("storage", storage, limit("storage_max"), central("storage_max")))
    return found


def on_this_box(
    limit: Limit, gpus: list[GpuReading], roots: Iterable[Path], central: Limit = no_limit
) -> list[Tier]:
    """The tiers of this box: its RAM and physical cores read now, ``gpus`` as read by the
    caller's probe, the drive of the first model root that exists."""
    cores = claimable_count(physical_cores())
    return tiers(limit, read_host(), gpus, cores, storage_total(roots), central)


def problems_on_this_box(
    limit: Limit, gpus: list[GpuReading], roots: Iterable[Path], central: Limit = no_limit
) -> list[str]:
    return [p for tier in on_this_box(limit, gpus, roots, central) for p in tier.problems()]


def describe(found: list[Tier]) -> list[Mapping[str, Any]]:
    return [
        {
            "resource": t.resource,
            "device": t.device,
            "box": t.box,
            "central": t.central,
            "effective": t.effective(),
        }
        for t in found
    ]
