"""Facts another box measured, taken in (``POST /v1/facts/import``, offered by a central).

A footprint is only worth something for the same bytes: the offer names the file's sha256
and size, and the box looks for its own files of that size only (one ``stat`` each), hashing
those once (the kept hashes, store/hashes.py) and taking the offer for each file whose
sha256 matches. Each footprint is filed under this box's file, labelled with the box that
measured it; a measurement made here later wins over it (box/facts.py)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from fitbox.models.catalog import Artifact
from fitbox.models.identity import Identity
from fitbox.models.transfer import OfferedFile
from fitbox.store.db import MeasuredFootprint
from fitbox.store.hashes import KeptHash

SIZES = ("weights_bytes", "kv_bytes", "compute_bytes", "output_bytes")
WHOLE = ("id", "artifact_size", "window", "parallel", *SIZES)
WORDS = ("device", "type_k", "type_v")
OPTIONAL_WHOLE = ("n_ctx", "n_ctx_seq")
OPTIONAL_NUMBERS = ("load_seconds", "measured_at")


class BadFact(ValueError):
    """A footprint the box cannot take; ``field`` names what is wrong."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(why)
        self.field = field


def _whole(row: dict[str, Any], name: str, optional: bool = False) -> int | None:
    value = row.get(name)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadFact(name, f"'{name}' must be a whole number, 0 or more; it is {value!r}")
    return value


def _number(row: dict[str, Any], name: str) -> float | None:
    value = row.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadFact(name, f"'{name}' must be a number; it is {value!r}")
    return float(value)


def footprint(row: Any, identity: Identity,
              origin_box: str) -> MeasuredFootprint:  # fmt: skip
    """One offered row (a ``measured_footprints`` row of the box that measured it, as its
    telemetry and the central's mirror carry it) filed under this box's file."""
    if not isinstance(row, dict):
        raise BadFact("footprints", "each footprint is a JSON object")
    whole = {name: _whole(row, name) for name in WHOLE}
    for name in WORDS:
        if not isinstance(row.get(name), str) or not row[name]:
            raise BadFact(name, f"'{name}' must be text; it is {row.get(name)!r}")
    if row.get("origin_box") is not None:
        raise BadFact("origin_box", "a footprint this box did not measure itself is not "
                                    "offered on: offer the one its own box measured")  # fmt: skip
    path, size, mtime_ns = identity
    return MeasuredFootprint(
        artifact=path, artifact_size=size, artifact_mtime_ns=mtime_ns, device=row["device"],
        window=int(whole["window"] or 0), parallel=int(whole["parallel"] or 0),
        type_k=row["type_k"], type_v=row["type_v"], weights=int(whole["weights_bytes"] or 0),
        kv=int(whole["kv_bytes"] or 0), compute=int(whole["compute_bytes"] or 0),
        output=int(whole["output_bytes"] or 0), n_ctx=_whole(row, "n_ctx", True),
        n_ctx_seq=_whole(row, "n_ctx_seq", True), load_seconds=_number(row, "load_seconds"),
        call_id=None, measured_at=_number(row, "measured_at") or 0.0,
        origin_box=origin_box, origin_id=whole["id"],
    )  # fmt: skip


def same_bytes(artifacts: Iterable[Artifact], size: int, sha256: str,
               kept: Callable[[OfferedFile], KeptHash]) -> tuple[list[Artifact], int]:  # fmt: skip
    """This box's files with these bytes, and how many files of that size were checked.
    ``kept`` hashes a file once (blocking: call this off the event loop)."""
    found, checked = [], 0
    for artifact in artifacts:
        try:
            identity = artifact.identity()
            real = artifact.path.resolve()
        except OSError:
            continue
        if identity.size != size:
            continue
        checked += 1
        offered = OfferedFile(artifact.path.name, artifact.path, real, identity.size,
                              identity.mtime_ns)  # fmt: skip
        if kept(offered).sha256 == sha256:
            found.append(artifact)
    return found, checked
