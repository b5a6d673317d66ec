"""decide(): where a model goes, and who must leave for it. Pure; see FORMULAS.md §Fit.

Stages, each with a named outcome:
1. feasibility: a device whose capacity is below the need is out (``Refuse`` if all are);
2. fit without eviction: the first device (GPUs in order, then host) with room wins;
3. fit by eviction: idle, ready, unpinned residents leave least-recently-used first; among devices
   where that makes room, the fewest evicted bytes win, then device order;
4. otherwise the room is held by calls in flight: ``Wait`` for them, naming them; if only
   pinned residents hold it, waiting cannot help: ``Refuse`` (held_by_pinned).
"""

from __future__ import annotations

from fitbox.core.types import (
    Ask,
    Decision,
    Device,
    DeviceKind,
    Place,
    Refuse,
    RefuseReason,
    ResidentState,
    ResidentView,
    Snapshot,
    Victim,
    VictimReason,
    Wait,
    WaitReason,
)


def _device_order(device: Device) -> tuple[int, str]:
    return (0 if device.kind is DeviceKind.GPU else 1, device.id)


def _evictable(resident: ResidentView) -> bool:
    return resident.state is ResidentState.READY and resident.calls == 0 and not resident.pinned


def decide(snapshot: Snapshot, ask: Ask) -> Decision:
    """Where ``ask`` goes. A device's own measured footprint, when the ask carries one,
    is what it needs there; otherwise the estimate."""
    devices = sorted((d for d in snapshot.devices if d.kind in ask.kinds), key=_device_order)
    feasible = [d for d in devices if d.capacity >= ask.footprint_on(d.id).total]
    if not feasible:
        largest = max(devices, key=lambda d: d.capacity, default=None)
        needed = ask.footprint_on(largest.id).total if largest else ask.footprint.total
        return Refuse(
            RefuseReason.LARGER_THAN_BOX, needed=needed,
            available=largest.capacity if largest else 0,
        )  # fmt: skip

    options: list[tuple[int, int, Place]] = []
    blockers: set[str] = set()
    best_available = 0
    for order, device in enumerate(feasible):
        need = ask.footprint_on(device.id).total
        on_device = [r for r in snapshot.residents if r.device == device.id]
        free = device.capacity - sum(r.bytes for r in on_device)
        if need <= free:
            return Place(device=device.id, victims=())
        idle = sorted((r for r in on_device if _evictable(r)), key=lambda r: (r.last_used, r.key))
        victims: list[Victim] = []
        for resident in idle:
            if free >= need:
                break
            victims.append(Victim(resident.key, resident.bytes, VictimReason.LEAST_RECENTLY_USED))
            free += resident.bytes
        best_available = max(best_available, free)
        if free >= need:
            evicted = sum(v.bytes for v in victims)
            options.append((evicted, order, Place(device=device.id, victims=tuple(victims))))
        else:
            blockers.update(r.key for r in on_device if not _evictable(r))

    if options:
        return min(options, key=lambda option: (option[0], option[1]))[2]
    pinned = {r.key for r in snapshot.residents if r.pinned and r.key in blockers}
    waiting_helps = any(
        r.key in blockers and not r.pinned for r in snapshot.residents
    )  # a busy or loading resident will leave room once it settles; a pinned one never
    if not waiting_helps:
        return Refuse(
            RefuseReason.HELD_BY_PINNED, needed=min(ask.footprint_on(d.id).total for d in feasible),
            available=best_available, holders=tuple(sorted(pinned)),
        )  # fmt: skip
    return Wait(
        WaitReason.BUSY_RESIDENTS,
        blockers=tuple(sorted(blockers)),
        needed=min(ask.footprint_on(d.id).total for d in feasible),
        available=best_available,
    )
