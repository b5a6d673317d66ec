"""Facts another box measured, taken in (``POST /v1/facts/import``, offered by a central):
footprints, refused windows and measured speeds.

A fact is only worth something for the same bytes: the offer names the file's sha256
and size, and the box looks for its own files of that size only (one ``stat`` each), hashing
those once (the kept hashes, store/hashes.py) and taking the offer for each file whose
sha256 matches. Each fact is filed under this box's file, labelled with the box that
measured it; a measurement made here wins over it (box/facts.py, box/speeds.py)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from fitbox.core.types import Rung
from fitbox.models.catalog import Artifact
from fitbox.models.identity import Identity
from fitbox.models.transfer import OfferedFile
from fitbox.store.db import MeasuredFootprint, MeasuredSpeed
from fitbox.store.facts import ImportedWindow
from fitbox.store.hashes import KeptHash

SIZES = ("weights_bytes", "kv_bytes", "compute_bytes", "output_bytes")
WHOLE = ("id", "artifact_size", "window", "parallel", *SIZES)
WORDS = ("device", "type_k", "type_v")
OPTIONAL_WHOLE = ("n_ctx", "n_ctx_seq")
OPTIONAL_NUMBERS = ("load_seconds", "measured_at")
RUNGS = frozenset(r.value for r in Rung)


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


def _words(row: dict[str, Any], names: Iterable[str]) -> None:
    for name in names:
        if not isinstance(row.get(name), str) or not row[name]:
            raise BadFact(name, f"'{name}' must be text; it is {row.get(name)!r}")


def _measured_there(row: Any, kind: str) -> dict[str, Any]:
    """An offered row as a JSON object its own box measured (an import is never passed on:
    the box it came from offers its own)."""
    if not isinstance(row, dict):
        raise BadFact(kind, f"each of '{kind}' is a JSON object")
    if row.get("origin_box") is not None:
        raise BadFact(
            "origin_box",
            f"a row of '{kind}' this box did not measure itself "
            "is not offered on: offer the one its own box "
            "measured",
        )
    return row


def footprint(row: Any, identity: Identity, origin_box: str) -> MeasuredFootprint:
    """One offered row (a ``measured_footprints`` row of the box that measured it, as its
    telemetry and the central's mirror carry it) filed under this box's file."""
    row = _measured_there(row, "footprints")
    whole = {name: _whole(row, name) for name in WHOLE}
    _words(row, WORDS)
    path, size, mtime_ns = identity
    return MeasuredFootprint(
        artifact=path,
        artifact_size=size,
        artifact_mtime_ns=mtime_ns,
        device=row["device"],
        window=int(whole["window"] or 0),
        parallel=int(whole["parallel"] or 0),
        type_k=row["type_k"],
        type_v=row["type_v"],
        weights=int(whole["weights_bytes"] or 0),
        kv=int(whole["kv_bytes"] or 0),
        compute=int(whole["compute_bytes"] or 0),
        output=int(whole["output_bytes"] or 0),
        n_ctx=_whole(row, "n_ctx", True),
        n_ctx_seq=_whole(row, "n_ctx_seq", True),
        load_seconds=_number(row, "load_seconds"),
        call_id=None,
        measured_at=_number(row, "measured_at") or 0.0,
        origin_box=origin_box,
        origin_id=whole["id"],
    )


def refused_window(row: Any, identity: Identity, origin_box: str) -> ImportedWindow:
    """One offered ``refused_windows`` row filed under this box's file."""
    row = _measured_there(row, "refused_windows")
    origin_id, window = _whole(row, "id"), _whole(row, "window")
    _words(row, ("placement", "type_k", "type_v"))
    detail = row.get("detail")
    if detail is not None and not isinstance(detail, str):
        raise BadFact("detail", f"'detail' must be text or null; it is {detail!r}")
    path, size, mtime_ns = identity
    return ImportedWindow(
        key=(path, size, mtime_ns, row["placement"], int(window or 0)),
        type_k=row["type_k"],
        type_v=row["type_v"],
        detail=detail,
        measured_at=_number(row, "measured_at") or 0.0,
        origin_box=origin_box,
        origin_id=int(origin_id or 0),
    )


def speed(row: Any, identity: Identity, origin_box: str) -> MeasuredSpeed:
    """One offered ``measured_speeds`` row filed under this box's file."""
    row = _measured_there(row, "speeds")
    _words(row, ("rung", "placement"))
    if row["rung"] not in RUNGS:
        raise BadFact(
            "rung", f"'rung' must be one of {', '.join(sorted(RUNGS))}; it is {row['rung']!r}"
        )
    prompt_ms, decode_ms = _number(row, "prompt_per_token_ms"), _number(row, "decode_per_token_ms")
    if prompt_ms is None and decode_ms is None:
        raise BadFact(
            "decode_per_token_ms",
            "a speed measures 'prompt_per_token_ms' or 'decode_per_token_ms'; this one neither",
        )
    if any(ms is not None and ms <= 0 for ms in (prompt_ms, decode_ms)):
        raise BadFact("decode_per_token_ms", "ms per token must be more than 0")
    return MeasuredSpeed(
        *identity,
        rung=row["rung"],
        placement=row["placement"],
        prompt_tokens=_whole(row, "prompt_tokens", True),
        prompt_per_token_ms=prompt_ms,
        decode_tokens=_whole(row, "decode_tokens", True),
        decode_per_token_ms=decode_ms,
        call_id=None,
        measured_at=_number(row, "measured_at") or 0.0,
        cores=_whole(row, "cores", True) or None,
        origin_box=origin_box,
        origin_id=_whole(row, "id"),
    )


def same_bytes(
    artifacts: Iterable[Artifact], size: int, sha256: str, kept: Callable[[OfferedFile], KeptHash]
) -> tuple[list[Artifact], int]:
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
        offered = OfferedFile(
            artifact.path.name, artifact.path, real, identity.size, identity.mtime_ns
        )
        if kept(offered).sha256 == sha256:
            found.append(artifact)
    return found, checked
