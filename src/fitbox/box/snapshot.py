"""The core's snapshot of the box: what each pool can hold now, who holds what, the cores.

One probe reading per decision serves pricing, deciding and labelling.
"""

from __future__ import annotations

from fitbox.core.claims import claim_pool, reserved_core
from fitbox.core.tiers import Tier, capacity
from fitbox.core.types import Device, DeviceKind, Snapshot
from fitbox.probe.gpus import GpuProbe
from fitbox.probe.host import physical_cores, read_host

from .preferences import Preferences
from .residents import Registry
from .sensors import BusyCores


class Snapshots:
    def __init__(
        self,
        gpus: GpuProbe,
        registry: Registry,
        prefs: Preferences,
        busy_percent: float = 90,
        busy_readings: int = 8,
    ) -> None:
        self.gpus, self.registry, self.prefs = gpus, registry, prefs
        self._cores = physical_cores()
        self.busy = BusyCores(self._cores, busy_percent, busy_readings)  # the sensors feed it

    def devices(self) -> list[Device]:
        """What each pool can hold now: live free memory plus what our own residents hold."""
        # what our residents already take in a free reading is added back; each resident's
        # budget is then charged in full (core/room.py), so a resident whose cache has not
        # grown to its budget yet keeps the difference: room sees budget - held now less
        held = self.registry.in_use_by_device()
        devices = []
        for gpu in self.gpus.read():
            device_id = f"gpu{gpu.index}"
            tier = Tier(
                f"vram:{device_id}",
                gpu.total,
                self.prefs.limit("vram_max"),
                self.prefs.central_limit("vram_max"),
            )
            # other processes' use is charged to the device: NVML free + what we hold
            unmanaged = (
                0 if gpu.simulated else max(gpu.total - gpu.free - held.get(device_id, 0), 0)
            )
            devices.append(
                Device(device_id, DeviceKind.GPU, capacity(tier, unmanaged), gpu.simulated)
            )
        # Weights are mmap'd: their pages sit in the page cache, which MemAvailable already
        # counts as available. Only the anonymous parts (KV, compute, output) are added back
        # (Resident.in_use), and of a growing cache only what it holds now.
        anonymous = held.get("host", 0)
        host = read_host()
        tier = Tier(
            "ram", host.mem_total, self.prefs.limit("ram_max"), self.prefs.central_limit("ram_max")
        )
        room = min(host.mem_available + anonymous, host.mem_total)
        devices.append(Device("host", DeviceKind.HOST, min(capacity(tier), room)))
        return devices

    def snapshot(self, devices: list[Device] | None = None) -> Snapshot:
        return Snapshot(
            devices=tuple(self.devices() if devices is None else devices),
            residents=tuple(r.view() for r in self.registry),
            cores=self.claimable_cores(),
            busy_cores=self.busy.busy(),
            # a cap an operator set stands; and the reserved core is lent only on a box
            # known quiet (box/sensors.py settled), never on one whose load is not yet read
            lend_reserved=self.prefs.cap("cpu_max") is None and self.busy.settled(),
        )

    def physical_cores(self) -> dict[int, frozenset[int]]:
        return dict(self._cores)

    def cpus_of(self, cores: tuple[int, ...]) -> frozenset[int]:
        """The logical CPUs of a claim's physical cores (SMT siblings go together)."""
        return frozenset().union(*(self._cores.get(c, frozenset()) for c in cores))

    def cores_kept(self, cores: tuple[int, ...]) -> tuple[int, ...]:
        """Where an engine left with ``cores`` runs: those, or, when all were taken, the
        reserved core, which it shares with the OS and never with an engine that computes
        (none on a one-core box)."""
        keep = reserved_core(self.claimable_cores())
        return cores or (() if keep is None else (keep,))

    def claimable_cores(self) -> tuple[int, ...]:
        """Physical cores claims are made from: the cores tier (--cpu-max) counts those
        engines may claim; the lowest stays for fitbox and the OS (core/claims.py)."""
        return claim_pool(self._cores, self.prefs.cap("cpu_max"))
