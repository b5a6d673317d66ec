"""Measured footprints: the key a measurement is filed under, and how a load log becomes one."""

from __future__ import annotations

from dataclasses import dataclass

from fitbox.core.types import Footprint
from fitbox.engines.load_log import LoadReport
from fitbox.models.catalog import Artifact
from fitbox.store.db import MeasuredFootprint

MeasuredKey = tuple[str, int, int, str, int, int, str, str]


@dataclass(frozen=True)
class Contract:
    """How a model is loaded: the terms that change what it costs."""

    window: int
    parallel: int
    type_k: str = "f16"
    type_v: str = "f16"


def measured_key(artifact: Artifact, device: str, contract: Contract) -> MeasuredKey:
    stat = artifact.path.stat()
    return (str(artifact.path), stat.st_size, stat.st_mtime_ns, device, contract.window,
            contract.parallel, contract.type_k, contract.type_v)  # fmt: skip


def measurement(
    report: LoadReport,
    artifact: Artifact,
    device: str,
    contract: Contract,
    load_seconds: float | None,
    call_id: int | None,
    now: float,
) -> MeasuredFootprint | None:
    """A load log's buffers as a measured footprint, or None if it shows no model buffers."""
    kinds = report.bytes_by_kind()
    if not kinds.get("model"):
        return None
    key = measured_key(artifact, device, contract)
    return MeasuredFootprint(
        artifact=key[0], artifact_size=key[1], artifact_mtime_ns=key[2], device=device,
        window=contract.window, parallel=contract.parallel, type_k=contract.type_k,
        type_v=contract.type_v, weights=kinds.get("model", 0),
        kv=kinds.get("kv", 0) + kinds.get("recurrent", 0), compute=kinds.get("compute", 0),
        output=kinds.get("output", 0), n_ctx=report.n_ctx, n_ctx_seq=report.n_ctx_seq,
        load_seconds=load_seconds, call_id=call_id, measured_at=now,
    )  # fmt: skip


def footprint_row(device: str, footprint: Footprint) -> dict[str, int | str]:
    return {
        "device": device,
        "weights_bytes": footprint.weights,
        "kv_bytes": footprint.kv,
        "compute_bytes": footprint.compute,
        "output_bytes": footprint.output,
        "total_bytes": footprint.total,
    }
