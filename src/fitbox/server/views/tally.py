"""What the box did, counted from the store for ``/metrics``: calls, errors, tokens, their
queue/load/ttft/total times, loads, evictions, refusals and each measured load's estimate
error. Nothing in ``box/`` counts for metrics: the rows it already writes are the record.

At each scrape the tally reads what changed since the last one, by the store's own cursors
(``seq`` for call rows, which change as a call moves; ``id`` for rows written once), and
feeds the new figures to prometheus_client counters and histograms. Counting starts when
the app starts (the cursors are taken then), as any exporter's counters do.

Times are the call row's stamps (box/calls.py writes them): queue = admitted - received,
load = load ready - load start (calls that waited on a load only), ttft = first byte -
received, total = last byte - received.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections import deque
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from fitbox.store.db import Store

SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
RATIO = (-0.5, -0.25, -0.1, -0.05, -0.02, 0.0, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)
# error codes that are the placement refusing a call (box/planning.py refusal_error), by
# the refusal reason they carry
REFUSALS = {
    "does_not_fit": "larger_than_box",
    "held_by_pinned": "held_by_pinned",
    "context_length_exceeded": "context",
    "no_cores": "no_cores",
    "no_candidate": "no_candidate",
    "model_busy": "model_busy",
}
# a task call's figures on its row (migrations/0026), as the unit they count: a new figure
# (an image's pixels) is one entry here
TASK_UNITS = {
    "audio_in_s": "audio_in_seconds",
    "audio_out_s": "audio_out_seconds",
    "image_pixels": "pixels",
}
KEEP_COUNTED = 4096  # call ids already counted, in case a finished row changes again
BATCH = 5000  # rows read per table per scrape


def reader(path: Path) -> sqlite3.Connection:
    """A read-only connection of its own: never the writer's."""
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    conn.text_factory = lambda raw: raw.decode("utf-8", "replace")
    return conn


def _span(row: sqlite3.Row, start: str, end: str) -> float | None:
    first, last = row[start], row[end]
    if first is None or last is None:
        return None
    return max(float(last) - float(first), 0.0)


def _call_times(registry: CollectorRegistry) -> dict[str, Histogram]:
    """The call's four durations (module docstring), a histogram each, by model."""
    return {
        name: Histogram(
            f"fitbox_call_{name}_seconds", text, ["model"], buckets=SECONDS, registry=registry
        )
        for name, text in (
            ("queue", "From a call's arrival to its admission onto a ready resident."),
            ("load", "The load a call waited on (calls that waited on one only)."),
            ("ttft", "From a call's arrival to its first byte from the engine."),
            ("total", "From a call's arrival to its last byte."),
        )
    }


def _task_counters(registry: CollectorRegistry) -> tuple[Counter, Counter]:
    """What task calls did: their audio seconds, and every figure by its unit."""
    audio = Counter(
        "fitbox_audio_seconds",
        "Audio seconds of finished task calls: transcribed (in) or spoken (out).",
        ["model", "endpoint", "direction"],
        registry=registry,
    )
    units = Counter(
        "fitbox_task_units",
        "What finished task calls did, by the unit their runner measures it in.",
        ["model", "endpoint", "unit"],
        registry=registry,
    )
    return audio, units


class Tally:
    def __init__(self, store: Store, registry: CollectorRegistry) -> None:
        self.store = store
        self._counted: deque[int] = deque(maxlen=KEEP_COUNTED)
        self._counted_set: set[int] = set()
        with contextlib.closing(reader(store.path)) as conn:
            self._call_seq = self._max(conn, "call_log", "seq")
            self._child_id = self._max(conn, "children", "id")
            self._eviction_id = self._max(conn, "evictions", "id")
            self._measured_id = self._max(conn, "measured_footprints", "id")
        by_model = ["model"]
        self.calls = Counter(
            "fitbox_calls",
            "Finished calls, by model, endpoint and outcome.",
            [*by_model, "endpoint", "outcome"],
            registry=registry,
        )
        self.errors = Counter(
            "fitbox_call_errors",
            "Calls that ended in an error, by code.",
            [*by_model, "code"],
            registry=registry,
        )
        self.tokens_in = Counter(
            "fitbox_prompt_tokens", "Prompt tokens of finished calls.", by_model, registry=registry
        )
        self.tokens_out = Counter(
            "fitbox_completion_tokens",
            "Completion tokens of finished calls.",
            by_model,
            registry=registry,
        )
        self.times = _call_times(registry)
        self.audio, self.units = _task_counters(registry)
        self.loads = Counter(
            "fitbox_loads", "Engine children started, by model.", by_model, registry=registry
        )
        self.evictions = Counter(
            "fitbox_evictions",
            "Residents that left, by reason.",
            [*by_model, "reason"],
            registry=registry,
        )
        self.refusals = Counter(
            "fitbox_refusals",
            "Calls the placement refused, by reason.",
            [*by_model, "reason"],
            registry=registry,
        )
        self.estimate_error = Histogram(
            "fitbox_load_estimate_error_ratio",
            "Each measured load: (bytes it was placed at - bytes the engine holds) / held; "
            "basis: what the placement priced it from (file headers, or an earlier load).",
            [*by_model, "basis"],
            buckets=RATIO,
            registry=registry,
        )

    @staticmethod
    def _max(conn: sqlite3.Connection, table: str, column: str) -> int:
        row = conn.execute(f"SELECT COALESCE(MAX({column}), 0) FROM {table}").fetchone()  # noqa: S608
        return int(row[0])

    def catch_up(self, names: dict[str, str], asked: dict[str, str] | None = None) -> None:
        """Count what changed since the last scrape. ``names``: artifact path -> model name
        (a path the catalog no longer lists is named by its file stem); ``asked``: each name
        and alias the catalog knows -> its model, for calls refused before they had an
        artifact (any other name a client sent is "": labels stay a bounded set)."""
        with contextlib.closing(reader(self.store.path)) as conn:
            self._calls_since(conn, names, asked or {})
            self._children_since(conn, names)
            self._evictions_since(conn)
            self._measured_since(conn, names)

    def _calls_since(
        self, conn: sqlite3.Connection, names: dict[str, str], asked: dict[str, str]
    ) -> None:
        rows = conn.execute(
            "SELECT * FROM call_log WHERE seq > ? ORDER BY seq LIMIT ?", (self._call_seq, BATCH)
        ).fetchall()
        for row in rows:
            self._call_seq = max(self._call_seq, int(row["seq"]))
            if row["outcome"] == "pending" or row["id"] in self._counted_set:
                continue
            model = _name(row["artifact"], names) or asked.get(
                (row["model_asked"] or "").split("@", 1)[0], ""
            )
            self._count_call(row, model)

    def _count_call(self, row: sqlite3.Row, model: str) -> None:
        if len(self._counted) == KEEP_COUNTED:
            self._counted_set.discard(self._counted[0])
        self._counted.append(row["id"])
        self._counted_set.add(row["id"])
        self.calls.labels(model, row["endpoint"], row["outcome"]).inc()
        code = row["error_code"]
        if row["outcome"] == "error":
            self.errors.labels(model, code or "unknown").inc()
            if code in REFUSALS:
                self.refusals.labels(model, REFUSALS[code]).inc()
        self.tokens_in.labels(model).inc(row["prompt_tokens"] or 0)
        self.tokens_out.labels(model).inc(row["completion_tokens"] or 0)
        self._count_task(row, model)
        spans = {
            "queue": _span(row, "received_at", "admitted_at"),
            "load": _span(row, "load_start_at", "load_ready_at"),
            "ttft": _span(row, "received_at", "first_byte_at"),
            "total": _span(row, "received_at", "last_byte_at"),
        }
        for name, seconds in spans.items():
            if seconds is not None:
                self.times[name].labels(model).observe(seconds)

    def _count_task(self, row: sqlite3.Row, model: str) -> None:
        """A task call's figures (none on a chat call's row)."""
        columns = row.keys()
        for column, unit in TASK_UNITS.items():
            value = row[column] if column in columns else None
            if value is None:
                continue
            self.units.labels(model, row["endpoint"], unit).inc(value)
            if column.startswith("audio_"):
                way = "in" if column == "audio_in_s" else "out"
                self.audio.labels(model, row["endpoint"], way).inc(value)

    def _children_since(self, conn: sqlite3.Connection, names: dict[str, str]) -> None:
        for row in conn.execute(
            "SELECT id, artifact FROM children WHERE id > ? ORDER BY id LIMIT ?",
            (self._child_id, BATCH),
        ):
            self._child_id = int(row["id"])
            self.loads.labels(_name(row["artifact"], names)).inc()

    def _evictions_since(self, conn: sqlite3.Connection) -> None:
        for row in conn.execute(
            "SELECT id, model, reason FROM evictions WHERE id > ? ORDER BY id LIMIT ?",
            (self._eviction_id, BATCH),
        ):
            self._eviction_id = int(row["id"])
            self.evictions.labels(row["model"], row["reason"]).inc()

    def _measured_since(self, conn: sqlite3.Connection, names: dict[str, str]) -> None:
        for row in conn.execute(
            "SELECT id, artifact, weights_bytes + kv_bytes + compute_bytes + output_bytes AS "
            "held, estimate_bytes, estimate_basis FROM measured_footprints WHERE id > ? "
            "ORDER BY id LIMIT ?",
            (self._measured_id, BATCH),
        ):
            self._measured_id = int(row["id"])
            if row["estimate_bytes"] is None or not row["held"]:
                continue
            error = (row["estimate_bytes"] - row["held"]) / row["held"]
            basis = row["estimate_basis"] or "estimate"
            self.estimate_error.labels(_name(row["artifact"], names), basis).observe(error)


def _name(artifact: Any, names: dict[str, str]) -> str:
    """The model a row's artifact path is; "" for a call that never reached one."""
    if not artifact:
        return ""
    return names.get(str(artifact)) or Path(str(artifact)).stem
