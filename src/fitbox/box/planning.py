"""The core's decision in words: the report ``fitbox plan`` and ``/v1/plan`` show, and the
error a client sees for a refusal."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fitbox.core.ask import Ask
from fitbox.core.decision import Decision, Place, Refuse, RefuseReason, Wait
from fitbox.core.types import Footprint, Snapshot
from fitbox.errors import DoesNotFit, EngineFailed, InvalidRequest
from fitbox.models.catalog import Artifact
from fitbox.units import format_bytes

from .task_plans import task_lines


def footprint_row(device: str, footprint: Footprint) -> dict[str, int | str]:
    return {
        "device": device,
        "weights_bytes": footprint.weights,
        "kv_bytes": footprint.kv,
        "compute_bytes": footprint.compute,
        "output_bytes": footprint.output,
        "total_bytes": footprint.total,
    }


def summed(parts: Iterable[Footprint]) -> Footprint:
    weights = kv = compute = output = 0
    for f in parts:
        weights, kv, compute, output = (
            weights + f.weights,
            kv + f.kv,
            compute + f.compute,
            output + f.output,
        )
    return Footprint(weights, kv, compute, output)


def basis(decision: Decision, ask: Ask) -> dict[str, str]:
    """Whether a placement's bytes were measured by a load or are still the estimate."""
    if not isinstance(decision, Place):
        return {}
    chosen = next(c for c in ask.candidates if c.key == decision.artifact)
    found = chosen.measured_fit(decision.where, decision.window, decision.type_k, decision.type_v)
    return {decision.artifact: "measured" if found else "estimate"}


def report(
    decision: Decision, snapshot: Snapshot, names: Mapping[str, str], basis: Mapping[str, str]
) -> dict[str, Any]:
    """The decision in the words of ``fitbox plan`` and ``/v1/plan``."""

    def name(key: str) -> str:
        return names.get(key, key)

    common = _common(decision, snapshot, name)
    if isinstance(decision, Place):
        return common | _placed(decision, name, basis)
    if isinstance(decision, Wait):
        return common | _waiting(decision, snapshot, name)
    assert isinstance(decision, Refuse)
    return common | _refused(decision, snapshot, name)


def _common(decision: Decision, snapshot: Snapshot, name: Callable[[str], str]) -> dict[str, Any]:
    """What every report shows: the placements rejected on the way, and the box's devices."""
    rejected = [
        {
            "artifact": name(r.artifact),
            "rung": r.rung.value,
            "kv": r.kv,
            "reason": r.reason.value,
            "detail": r.detail,
        }
        for r in decision.rejected
    ]
    held = {d.id: 0 for d in snapshot.devices} | snapshot.held_by_device()
    box = [
        {
            "device": d.id,
            "capacity_bytes": d.capacity,
            "free_bytes": d.capacity - held[d.id],
            "simulated": d.simulated,
        }
        for d in snapshot.devices
    ]
    return {"rejected": rejected, "box": box}


def _placed(
    decision: Place, name: Callable[[str], str], basis: Mapping[str, str]
) -> dict[str, Any]:
    return {
        "decision": "place",
        "artifact_key": decision.artifact,
        "rung": decision.rung.value,
        "window": decision.window,
        "type_k": decision.type_k,
        "type_v": decision.type_v,
        "device": decision.device,
        "basis": basis.get(decision.artifact, "estimate"),
        "devices": [footprint_row(d, f) for d, f in decision.footprint],
        "gpu_layers": decision.gpu_layers,
        "tensor_split": list(decision.tensor_split),
        "experts_in_ram": decision.experts_in_ram,
        "load_in_4bit": decision.load_in_4bit,
        "cores": list(decision.cores),
        "repack": decision.repack.value,
        "no_repack": decision.no_repack,
        "band": None
        if decision.band is None
        else {
            "kind": decision.band.kind.value,
            "min": decision.band.feasible_min,
            "max": decision.band.feasible_max,
        },
        "victims": [name(v.key) for v in decision.victims],
        "predicted_seconds": decision.predicted_seconds,
        "device_counts": [  # multi-GPU: the window each GPU count would have given
            {
                "count": c.count,
                "devices": list(c.gpus),
                "window": c.window,
                "victims": [name(k) for k in c.victims],
                "reason": c.reason.value,
            }
            for c in decision.device_counts
        ],
    }


def _waiting(decision: Wait, snapshot: Snapshot, name: Callable[[str], str]) -> dict[str, Any]:
    return {
        "decision": "wait",
        "reason": decision.reason.value,
        "blockers": [name(k) for k in decision.blockers],
        "needed_bytes": decision.needed,
        "available_bytes": decision.available,
        "bound_seconds": decision.bound,
        "device": snapshot.devices[0].id,
        "devices": [],
        "basis": "estimate",
    }


def _refused(decision: Refuse, snapshot: Snapshot, name: Callable[[str], str]) -> dict[str, Any]:
    rows = [footprint_row(decision.device, decision.footprint)] if decision.footprint else []
    return {
        "decision": "refuse",
        "reason": decision.reason.value,
        "needed_bytes": decision.needed,
        "available_bytes": decision.available,
        "device": decision.device or snapshot.devices[-1].id,
        "detail": decision.detail,
        "holders": [name(k) for k in decision.holders],
        "devices": rows,
        "window_tried": decision.window,
        "basis": "estimate",
    }


def refusal_error(decision: Refuse, names: Mapping[str, str], first: Artifact) -> Exception:
    """The error a client sees for a refusal: what binds, with its numbers."""
    needed, available = format_bytes(decision.needed), format_bytes(decision.available)
    if decision.reason is RefuseReason.HELD_BY_PINNED:
        pinned = [names.get(k, k) for k in decision.holders]
        return DoesNotFit(
            f"'{first.name}' needs {needed} on {decision.device}; the room is held by "
            f"pinned models ({', '.join(pinned)}): unpin one to make room",
            param="model",
            code="held_by_pinned",
            needed_bytes=decision.needed,
            available_bytes=decision.available,
            pinned=pinned,
        )
    if decision.reason is RefuseReason.LARGER_THAN_BOX:
        return DoesNotFit(
            f"'{first.name}' needs {needed} on {decision.device} even at a "
            f"{decision.window}-token window, but it holds {available} when empty "
            f"(raise --ram-max, or use a smaller quant)",
            param="model",
            needed_bytes=decision.needed,
            available_bytes=decision.available,
        )
    if decision.reason is RefuseReason.CONTEXT:
        return InvalidRequest(
            f"'{first.name}' cannot take this call: {decision.detail}",
            param="messages",
            code="context_length_exceeded",
        )
    if decision.reason is RefuseReason.NO_CORES:
        return DoesNotFit(
            f"'{first.name}' would get {decision.available} free core(s); it "
            f"needs {decision.needed}: {decision.detail}",
            param="model",
            code="no_cores",
        )
    if decision.reason is RefuseReason.BAD_ARTIFACT:
        return EngineFailed(f"'{first.name}' cannot be loaded: {decision.detail}")
    return InvalidRequest(f"'{first.name}': {decision.detail}", param="model", code="no_candidate")


def lines(report: Mapping[str, Any]) -> list[str]:
    """A report in words, as ``fitbox plan`` prints it and the helper's ``why`` answers:
    the decision, its window, bytes per device, and every placement rejected, with why."""
    out: list[str] = []
    simulated = {d["device"] for d in report["box"] if d["simulated"]}
    label = f"{report['decision']} on {report['device']}"
    if report.get("rung"):
        label += f" ({report['rung']})"
    out.append(
        f"{report['model']} ({report['architecture']}, {report['quant']}): {label}, "
        f"{report['basis']}"
    )
    if report.get("task"):  # no window, slots or cache: its runner and speed instead
        out += task_lines(report)
    else:
        band = report.get("band")
        band_text = f", band {band['kind']} {band['min']}..{band['max']}" if band else ""
        out.append(
            f"  window {report['window']} x {report['parallel']} slot(s), "
            f"K {report['type_k']} / V {report['type_v']}{band_text}"
        )
    if report.get("device_counts"):  # the window each GPU count would have given
        counts = [
            f"{c['count']} -> {c['window'] or 'none'} ({c['reason']})"
            for c in report["device_counts"]
        ]
        out.append(f"  by GPU count: {', '.join(counts)}")
    if report.get("repack") in ("on", "ram_bound"):
        out.append(
            "  weights in RAM: repacked (faster)"
            if report["repack"] == "on"
            else "  weights in RAM: --no-repack (ram_bound: the repacked copy does not fit)"
        )
    for row in report["devices"]:
        tag = " (SIMULATED)" if row["device"] in simulated else ""
        b = {k: format_bytes(v) for k, v in row.items() if k.endswith("_bytes")}
        if report.get("task"):  # one process: its files and its runner, as one figure
            out.append(f"  {row['device']}{tag}: {b['total_bytes']} held by its process")
            continue
        out.append(
            f"  {row['device']}{tag}: weights {b['weights_bytes']} + kv {b['kv_bytes']} + "
            f"compute {b['compute_bytes']} + output {b['output_bytes']} = "
            f"{b['total_bytes']}"
        )
    if report.get("cores"):
        layers = f", {report['gpu_layers']} layers on GPU" if report.get("gpu_layers") else ""
        out.append(f"  cores {', '.join(map(str, report['cores']))}{layers}")
    for key in ("victims", "blockers"):
        if report.get(key):
            out.append(f"  {key}: {', '.join(report[key])}")
    if report["decision"] == "refuse" and report.get("needed_bytes"):
        needed, held = format_bytes(report["needed_bytes"]), format_bytes(report["available_bytes"])
        out.append(
            f"  {report['reason']}: needs {needed} on {report['device']}, which holds {held}"
        )
    elif report["decision"] == "refuse":  # no rung was ever sized: their reasons say why
        out.append(f"  {report['reason']}: no rung of it can be placed on this box, because:")
    for r in report.get("rejected", []):
        out.append(f"  - {r['rung']} {r['artifact']}: {r['reason']} ({r['detail']})")
    return out
