"""Measured facts in the store: what a load allocated, how fast a call ran, which windows
failed to load. Their types and the SQL that writes and reads their tables, each function
given the connection (the store's writer thread, or a read-only one); store/db.py owns the
writer and records the event of every row written here."""

from __future__ import annotations

import contextlib
import sqlite3
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class MeasuredFootprint:
    """What one load really allocated (from the engine's load log)."""

    artifact: str
    artifact_size: int
    artifact_mtime_ns: int
    device: str
    window: int
    parallel: int
    type_k: str
    type_v: str
    weights: int
    kv: int
    compute: int
    output: int
    n_ctx: int | None = None
    n_ctx_seq: int | None = None
    load_seconds: float | None = None
    call_id: int | None = None
    measured_at: float = 0.0
    estimate_bytes: int | None = None  # what the placement priced it at, before the load
    estimate_basis: str | None = None  # "estimate" or "measured" (an earlier load)
    origin_box: str | None = None  # imported: the box that measured it (None: this box)
    origin_id: int | None = None  # imported: its row id on that box
    # the projector loaded beside it (Artifact.projector_identity); None: none, or unknown
    projector: str | None = None

    @property
    def key(self) -> tuple[str, int, int, str, int, int, str, str]:
        return (
            self.artifact,
            self.artifact_size,
            self.artifact_mtime_ns,
            self.device,
            self.window,
            self.parallel,
            self.type_k,
            self.type_v,
        )


@dataclass(frozen=True)
class MeasuredSpeed:
    """What one call's engine timings said about a file on a rung."""

    artifact: str
    artifact_size: int
    artifact_mtime_ns: int
    rung: str
    placement: str
    prompt_tokens: int | None
    prompt_per_token_ms: float | None
    decode_tokens: int | None
    decode_per_token_ms: float | None
    call_id: int | None
    measured_at: float
    cores: int | None = None  # physical cores the engine ran on: a point of its thread curve
    origin_box: str | None = None  # imported: the box that measured it (None: this box)
    origin_id: int | None = None  # imported: its row id on that box

    @property
    def key(self) -> tuple[str, int, int, str]:
        return (self.artifact, self.artifact_size, self.artifact_mtime_ns, self.rung)


# ((artifact, size, mtime_ns, rung), cores it ran on, decode ms per token, the box that
# measured it: None for this one): a curve point
CurvePoint = tuple[tuple[str, int, int, str], int, float, str | None]


# (artifact, size, mtime_ns, placement, window) of a window that failed to load
RefusedWindowKey = tuple[str, int, int, str, int]


@dataclass(frozen=True)
class ImportedWindow:
    """A window another box's load was refused at, filed under this box's file."""

    key: RefusedWindowKey
    type_k: str
    type_v: str
    detail: str | None
    measured_at: float
    origin_box: str
    origin_id: int


def insert_footprint(conn: sqlite3.Connection, m: MeasuredFootprint) -> int:
    return int(
        conn.execute(
            "INSERT INTO measured_footprints (artifact, artifact_size, artifact_mtime_ns, "
            "device, window, parallel, type_k, type_v, weights_bytes, kv_bytes, "
            "compute_bytes, output_bytes, n_ctx, n_ctx_seq, load_seconds, call_id, "
            "measured_at, estimate_bytes, estimate_basis, origin_box, origin_id, projector) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                m.artifact,
                m.artifact_size,
                m.artifact_mtime_ns,
                m.device,
                m.window,
                m.parallel,
                m.type_k,
                m.type_v,
                m.weights,
                m.kv,
                m.compute,
                m.output,
                m.n_ctx,
                m.n_ctx_seq,
                m.load_seconds,
                m.call_id,
                m.measured_at,
                m.estimate_bytes,
                m.estimate_basis,
                m.origin_box,
                m.origin_id,
                m.projector,
            ),
        ).lastrowid
        or 0
    )


def import_footprint(conn: sqlite3.Connection, m: MeasuredFootprint) -> int | None:
    """File a footprint another box measured; None when this offer was taken before."""
    taken = conn.execute(
        "SELECT id FROM measured_footprints WHERE origin_box = ? AND origin_id = ? AND "
        "artifact = ?",
        (m.origin_box, m.origin_id, m.artifact),
    ).fetchone()
    return None if taken else insert_footprint(conn, m)


def latest_footprints(conn: sqlite3.Connection) -> list[MeasuredFootprint]:
    """The newest measurement of every placement key; one made here wins over an imported
    one (measured by another box on a file with the same bytes) whatever their order."""
    rows = conn.execute(
        "SELECT * FROM measured_footprints WHERE id IN (SELECT MAX(id) FROM measured_footprints"
        " GROUP BY artifact, artifact_size, artifact_mtime_ns, device, window, parallel,"
        " type_k, type_v, origin_box IS NULL) ORDER BY origin_box IS NULL, id"
    )
    newest: dict[tuple[str, int, int, str, int, int, str, str], MeasuredFootprint] = {}
    for r in rows:  # imported first: a local one of the same key replaces it
        m = MeasuredFootprint(
            artifact=r["artifact"],
            artifact_size=r["artifact_size"],
            artifact_mtime_ns=r["artifact_mtime_ns"],
            device=r["device"],
            window=r["window"],
            parallel=r["parallel"],
            type_k=r["type_k"],
            type_v=r["type_v"],
            weights=r["weights_bytes"],
            kv=r["kv_bytes"],
            compute=r["compute_bytes"],
            output=r["output_bytes"],
            n_ctx=r["n_ctx"],
            n_ctx_seq=r["n_ctx_seq"],
            load_seconds=r["load_seconds"],
            call_id=r["call_id"],
            measured_at=r["measured_at"],
            origin_box=r["origin_box"],
            origin_id=r["origin_id"],
            projector=r["projector"],
        )
        newest[m.key] = m
    return list(newest.values())


def read_measured(path: Path) -> list[MeasuredFootprint]:
    """Measurements from a store file, read-only and without migrating or touching it (for
    commands that run beside a live service)."""
    if not path.exists():
        return []
    try:
        with contextlib.closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)) as conn:
            conn.row_factory = sqlite3.Row
            return latest_footprints(conn)
    except sqlite3.Error:
        return []


def insert_speed(conn: sqlite3.Connection, m: MeasuredSpeed) -> int:
    return int(
        conn.execute(
            "INSERT INTO measured_speeds (artifact, artifact_size, artifact_mtime_ns, rung, "
            "placement, prompt_tokens, prompt_per_token_ms, decode_tokens, decode_per_token_ms,"
            " call_id, measured_at, cores, origin_box, origin_id) VALUES "
            "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                m.artifact,
                m.artifact_size,
                m.artifact_mtime_ns,
                m.rung,
                m.placement,
                m.prompt_tokens,
                m.prompt_per_token_ms,
                m.decode_tokens,
                m.decode_per_token_ms,
                m.call_id,
                m.measured_at,
                m.cores,
                m.origin_box,
                m.origin_id,
            ),
        ).lastrowid
        or 0
    )


def _taken(
    conn: sqlite3.Connection,
    table: str,
    origin_box: str | None,
    origin_id: int | None,
    artifact: str,
) -> bool:
    """Whether this offer (the origin's row, filed under this file) was taken before."""
    return (
        conn.execute(
            f"SELECT 1 FROM {table} WHERE origin_box = ? AND origin_id = ? AND "  # noqa: S608
            "artifact = ?",
            (origin_box, origin_id, artifact),
        ).fetchone()
        is not None
    )


def import_speed(conn: sqlite3.Connection, m: MeasuredSpeed) -> int | None:
    """File a speed another box measured; None when this offer was taken before."""
    taken = _taken(conn, "measured_speeds", m.origin_box, m.origin_id, m.artifact)
    return None if taken else insert_speed(conn, m)


def recent_speeds(conn: sqlite3.Connection) -> list[MeasuredSpeed]:
    """The last 20 speeds of every (file, rung), oldest first."""
    rows = conn.execute(
        "SELECT artifact, artifact_size, artifact_mtime_ns, rung, placement, "
        "prompt_tokens, prompt_per_token_ms, decode_tokens, decode_per_token_ms, call_id,"
        " measured_at, cores, origin_box, origin_id FROM recent_speeds ORDER BY id"
    )
    return [MeasuredSpeed(*row) for row in rows]


def recent_curve(conn: sqlite3.Connection) -> list[CurvePoint]:
    """The last 60 decode rates of every (file, rung) with the cores they ran on, oldest
    first, this box's own and imported ones apart: the thread curve a restarted box places
    with."""
    rows = conn.execute(
        "SELECT artifact, artifact_size, artifact_mtime_ns, rung, cores, decode_per_token_ms,"
        " origin_box FROM recent_curve ORDER BY id"
    )
    return [
        ((a, size, mtime, rung), cores, ms, origin)
        for a, size, mtime, rung, cores, ms, origin in rows
    ]


def insert_refused_window(
    conn: sqlite3.Connection,
    key: RefusedWindowKey,
    type_k: str,
    type_v: str,
    detail: str | None,
    call_id: int | None,
    at: float,
) -> int:
    artifact, size, mtime_ns, placement, window = key
    return int(
        conn.execute(
            "INSERT INTO refused_windows (artifact, artifact_size, artifact_mtime_ns, placement,"
            " window, type_k, type_v, detail, call_id, measured_at) VALUES "
            "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (artifact, size, mtime_ns, placement, window, type_k, type_v, detail, call_id, at),
        ).lastrowid
        or 0
    )


def import_refused_window(conn: sqlite3.Connection, w: ImportedWindow) -> int | None:
    """File a window another box's load was refused at; None when taken before."""
    artifact, size, mtime_ns, placement, window = w.key
    if _taken(conn, "refused_windows", w.origin_box, w.origin_id, artifact):
        return None
    return int(
        conn.execute(
            "INSERT INTO refused_windows (artifact, artifact_size, artifact_mtime_ns, placement,"
            " window, type_k, type_v, detail, call_id, measured_at, origin_box, origin_id) VALUES"
            " (?, ?, ?, ?, ?, ?, ?, ?, NULL, ?, ?, ?)",
            (
                artifact,
                size,
                mtime_ns,
                placement,
                window,
                w.type_k,
                w.type_v,
                w.detail,
                w.measured_at,
                w.origin_box,
                w.origin_id,
            ),
        ).lastrowid
        or 0
    )


def refused_windows(conn: sqlite3.Connection) -> list[tuple[RefusedWindowKey, str | None]]:
    """Every window that failed to load, oldest first, with the box that measured it (None:
    this one)."""
    return [
        (tuple(r[:5]), r[5])
        for r in conn.execute(
            "SELECT artifact, artifact_size, artifact_mtime_ns, placement, window, origin_box "
            "FROM refused_windows ORDER BY id"
        )
    ]
