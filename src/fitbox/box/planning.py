"""From what the box knows to the core's inputs, and from the core's decision to a report.

Facts the core reads first: a measured footprint for the same file, placement class,
window, slots and cache types replaces the estimate; every measured load marks its window
as reachable; a load that ran out of memory marks its window as refused; measured load
seconds are the load term of T. Nothing here guesses a speed.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from fitbox.core.ask import Ask, Candidate, MeasuredFit, Speeds
from fitbox.core.decision import Decision, Place, Refuse, RefuseReason, Wait
from fitbox.core.pins import Pins
from fitbox.core.types import Footprint, Goal, Rung, Snapshot
from fitbox.errors import DoesNotFit, EngineFailed, InvalidRequest
from fitbox.models.catalog import Artifact, is_four_bit
from fitbox.store.db import MeasuredFootprint, MeasuredSpeed
from fitbox.units import format_bytes

from .pricing import MeasuredKey, footprint_row


def median_speeds(recent: Iterable[MeasuredSpeed]) -> Speeds:
    """The medians of the last measured prompt and decode ms per token."""
    rows = list(recent)
    prompt = [r.prompt_per_token_ms for r in rows if r.prompt_per_token_ms is not None]
    decode = [r.decode_per_token_ms for r in rows if r.decode_per_token_ms is not None]
    return Speeds(prompt_ms=statistics.median(prompt) if prompt else None,
                  decode_ms=statistics.median(decode) if decode else None)  # fmt: skip


def candidate(
    artifact: Artifact,
    measured: Mapping[MeasuredKey, MeasuredFootprint],
    parallel: int,
    refused: Iterable[tuple[str, int]] = (),
    rates: Mapping[Rung, Speeds] | None = None,
) -> Candidate:
    stat = artifact.path.stat()
    fits, loaded, speeds = [], [], {}
    for m in measured.values():
        if (m.artifact, m.artifact_size, m.artifact_mtime_ns, m.parallel) != (
            str(artifact.path), stat.st_size, stat.st_mtime_ns, parallel,
        ):  # fmt: skip
            continue
        fits.append(MeasuredFit(m.device, m.window, m.type_k, m.type_v,
                                Footprint(m.weights, m.kv, m.compute, m.output)))  # fmt: skip
        loaded.append((m.device, m.window))
        if m.load_seconds is not None:
            rung = Rung.RAM_ONLY if m.device == "host" else Rung.GPU_ONLY
            speeds[rung] = Speeds(load_seconds=m.load_seconds)
    for rung, rate in (rates or {}).items():  # engine timings: prompt and decode ms per token
        if rate.prompt_ms is not None or rate.decode_ms is not None:
            load = speeds.get(rung, Speeds()).load_seconds
            speeds[rung] = Speeds(load, rate.prompt_ms, rate.decode_ms)
    return Candidate(
        key=artifact.key, quant=artifact.facts.quant, shape=artifact.facts.shape,
        layout=artifact.facts.layout, four_bit=is_four_bit(artifact.facts.quant),
        measured=tuple(fits), loaded_windows=tuple(loaded), refused_windows=tuple(refused),
        speeds=tuple(speeds.items()),
    )  # fmt: skip


def ask(
    name: str,
    pins: Pins,
    candidates: tuple[Candidate, ...],
    *,
    window: int,
    parallel: int,
    need: int,
    max_wait: float,
    kv_types: tuple[tuple[str, str], ...] = (("f16", "f16"),),
    max_tokens: int = 0,
    cpu_floor: int = 1,
    goal: Goal = Goal.QUALITY,
) -> Ask:
    return Ask(
        model=name, candidates=candidates, need=need, window=window, parallel=parallel,
        kv_types=kv_types, rungs=pins.rungs, quant=pins.quant, max_wait=max_wait,
        max_tokens=max_tokens, cpu_floor=cpu_floor, goal=goal,
    )  # fmt: skip


def report(
    decision: Decision, snapshot: Snapshot, names: Mapping[str, str], basis: Mapping[str, str]
) -> dict[str, Any]:
    """The decision in the words of ``fitbox plan`` and ``/v1/plan``."""

    def name(key: str) -> str:
        return names.get(key, key)

    rejected = [
        {"artifact": name(r.artifact), "rung": r.rung.value, "kv": r.kv,
         "reason": r.reason.value, "detail": r.detail}
        for r in decision.rejected
    ]  # fmt: skip
    held = {d.id: 0 for d in snapshot.devices}
    for r in snapshot.residents:
        for device, size in r.holdings():
            held[device] = held.get(device, 0) + size
    box = [{"device": d.id, "capacity_bytes": d.capacity, "free_bytes": d.capacity - held[d.id],
            "simulated": d.simulated} for d in snapshot.devices]  # fmt: skip
    common: dict[str, Any] = {"rejected": rejected, "box": box}
    if isinstance(decision, Place):
        return {
            **common, "decision": "place", "artifact_key": decision.artifact,
            "rung": decision.rung.value, "window": decision.window,
            "type_k": decision.type_k, "type_v": decision.type_v,
            "device": decision.device, "basis": basis.get(decision.artifact, "estimate"),
            "devices": [footprint_row(d, f) for d, f in decision.footprint],
            "gpu_layers": decision.gpu_layers, "tensor_split": list(decision.tensor_split),
            "experts_in_ram": decision.experts_in_ram, "cores": list(decision.cores),
            "band": None if decision.band is None else {
                "kind": decision.band.kind.value, "min": decision.band.feasible_min,
                "max": decision.band.feasible_max},
            "victims": [name(v.key) for v in decision.victims],
            "predicted_seconds": decision.predicted_seconds,
            "device_counts": [  # multi-GPU: the window each GPU count would have given
                {"count": c.count, "devices": list(c.gpus), "window": c.window,
                 "victims": [name(k) for k in c.victims], "reason": c.reason.value}
                for c in decision.device_counts],
        }  # fmt: skip
    if isinstance(decision, Wait):
        return {**common, "decision": "wait", "reason": decision.reason.value,
                "blockers": [name(k) for k in decision.blockers],
                "needed_bytes": decision.needed, "available_bytes": decision.available,
                "bound_seconds": decision.bound, "device": snapshot.devices[0].id,
                "devices": [], "basis": "estimate"}  # fmt: skip
    assert isinstance(decision, Refuse)
    rows = [footprint_row(decision.device, decision.footprint)] if decision.footprint else []
    return {**common, "decision": "refuse", "reason": decision.reason.value,
            "needed_bytes": decision.needed, "available_bytes": decision.available,
            "device": decision.device or snapshot.devices[-1].id, "detail": decision.detail,
            "holders": [name(k) for k in decision.holders], "devices": rows,
            "window_tried": decision.window, "basis": "estimate"}  # fmt: skip


def refusal_error(decision: Refuse, names: Mapping[str, str], first: Artifact) -> Exception:
    """The error a client sees for a refusal: what binds, with its numbers."""
    needed, available = format_bytes(decision.needed), format_bytes(decision.available)
    if decision.reason is RefuseReason.HELD_BY_PINNED:
        pinned = [names.get(k, k) for k in decision.holders]
        return DoesNotFit(
            f"'{first.name}' needs {needed} on {decision.device}; the room is held by "
            f"pinned models ({', '.join(pinned)}): unpin one to make room",
            param="model", code="held_by_pinned", needed_bytes=decision.needed,
            available_bytes=decision.available, pinned=pinned,
        )  # fmt: skip
    if decision.reason is RefuseReason.LARGER_THAN_BOX:
        return DoesNotFit(
            f"'{first.name}' needs {needed} on {decision.device} even at a "
            f"{decision.window}-token window, but it holds {available} when empty "
            f"(raise --ram-max, or use a smaller quant)",
            param="model", needed_bytes=decision.needed, available_bytes=decision.available,
        )  # fmt: skip
    if decision.reason is RefuseReason.CONTEXT:
        return InvalidRequest(f"'{first.name}' cannot take this call: {decision.detail}",
                              param="messages", code="context_length_exceeded")  # fmt: skip
    if decision.reason is RefuseReason.NO_CORES:
        return DoesNotFit(f"'{first.name}' would get {decision.available} free core(s); it "
                          f"needs {decision.needed}: {decision.detail}", param="model",
                          code="no_cores")  # fmt: skip
    if decision.reason is RefuseReason.BAD_ARTIFACT:
        return EngineFailed(f"'{first.name}' cannot be loaded: {decision.detail}")
    return InvalidRequest(f"'{first.name}': {decision.detail}", param="model",
                          code="no_candidate")  # fmt: skip
