"""The box's capacity tiers, read from the probes and the settings (core/tiers.py's rules).

device >= box setting (--ram-max, --vram-max, --cpu-max) >= central setting (none yet: a
central that allots limits is issue #7's and the federation's).
"""

from __future__ import annotations

from fitbox.config import Config
from fitbox.core.tiers import Tier
from fitbox.probe.gpus import GpuReading
from fitbox.probe.host import HostReading


def tiers(config: Config, host: HostReading, gpus: list[GpuReading], cores: int) -> list[Tier]:
    found = [Tier("ram", host.mem_total, config.ram_max)]
    found += [Tier(f"vram:gpu{g.index}", g.total, config.vram_max) for g in gpus]
    # one core stays for fitbox and the OS; the rest is what engines may claim
    found.append(Tier("cores", max(cores - 1, 1), config.cpu_max))
    return found


def problems(config: Config, host: HostReading, gpus: list[GpuReading], cores: int) -> list[str]:
    """Why the settings cannot be used on this box: each a setting above its parent tier."""
    return [p for tier in tiers(config, host, gpus, cores) for p in tier.problems()]
