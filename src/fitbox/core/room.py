"""Room per device (FORMULAS.md §Room per device): free now, once idle residents leave, once
busy ones settle too, and on an empty device."""

from __future__ import annotations

from collections.abc import Mapping

from fitbox.core.split import HOST
from fitbox.core.types import DeviceKind, Footprint, Snapshot


class Room:
    """Bytes per device: free now, free after every idle resident left, free after every
    unpinned resident settled and left, and free on an empty device."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        reserved: dict[str, int] = {}
        for promise in snapshot.reservations:
            reserved[promise.device] = reserved.get(promise.device, 0) + promise.bytes
        self.empty = {d.id: d.capacity - reserved.get(d.id, 0) for d in snapshot.devices}
        self.now = dict(self.empty)
        self.most = dict(self.empty)
        self.hopeful = dict(self.empty)
        for r in snapshot.residents:
            for device, held in r.holdings():
                if device not in self.now:
                    continue
                self.now[device] -= held
                if not r.evictable:
                    self.most[device] -= held
                if not (r.evictable or r.settles):
                    self.hopeful[device] -= held
        # The snapshot lists GPUs as the probe numbers them, which is the engine's (CUDA)
        # order: -ts shares and the output layer follow it, so it is never re-sorted by name
        # (by name, gpu10 would come before gpu2).
        self.gpus = [d.id for d in snapshot.devices if d.kind is DeviceKind.GPU]
        self.order = {g: i for i, g in enumerate(self.gpus)}
        # a declared inventory is taken at its word, whatever the engine was built with: on a
        # box without a GPU it is how the GPU paths run at all (on a CPU-only engine)
        self.declared_gpus = any(d.simulated for d in snapshot.devices)
        self.has_host = HOST in self.empty

    def fits(self, need: Mapping[str, Footprint], pool: Mapping[str, int]) -> bool:
        return all(d in pool and f.total <= pool[d] for d, f in need.items())

    def roomiest_gpu(self) -> str:
        return min(self.gpus, key=lambda g: (-self.most[g], self.order[g]))
