"""What happened on the box, as rows of the store: children started and ended, operator
actions, sensor readings, GPU processes, evictions, pulls and scout's findings."""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

from fitbox.store.queue import Queued


class History(Queued):
    """The box's event rows; each write is queued, never waited for."""

    def child_started(
        self,
        pid: int,
        create_time: float,
        port: int,
        artifact: str,
        argv: list[str],
        placement: dict[str, Any] | None = None,
    ) -> None:
        """``placement``: what adopting it again needs (box/supervision/adoption.py)."""
        now = time.time()
        placed = json.dumps(placement) if placement is not None else None
        self._submit(
            lambda conn: self._insert(
                conn,
                "child",
                "children",
                "INSERT INTO children (pid, create_time, port, artifact, argv, started_at,"
                " placement) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (pid, create_time, port, artifact, json.dumps(argv), now, placed),
            )
        )

    def child_ended(self, pid: int, create_time: float, how: str) -> None:
        now = time.time()

        def end(conn: sqlite3.Connection) -> None:
            for (row_id,) in conn.execute(
                "SELECT id FROM children WHERE pid = ? AND create_time = ? AND ended_at IS NULL",
                (pid, create_time),
            ).fetchall():
                self._ended(conn, row_id, how, now)

        self._submit(end)

    def child_ready(self, pid: int, create_time: float, placement: dict[str, Any]) -> None:
        """The placement a child turned ready with: what adopting it needs."""
        placed = json.dumps(placement)

        def update(conn: sqlite3.Connection) -> None:
            conn.execute(
                "UPDATE children SET placement = ? WHERE pid = ? AND create_time = ?"
                " AND ended_at IS NULL",
                (placed, pid, create_time),
            )

        self._submit(update)

    def child_row_ended(self, row_id: int, how: str) -> None:
        now = time.time()
        self._submit(lambda conn: self._ended(conn, row_id, how, now))

    def _ended(self, conn: sqlite3.Connection, row_id: int, how: str, now: float) -> None:
        conn.execute(
            "UPDATE children SET ended_at = ?, ended_how = ? WHERE id = ?", (now, how, row_id)
        )
        self._event(conn, "child", "children", row_id)

    def open_children(self) -> list[dict[str, Any]]:
        """Children never recorded as ended: row id, pid, create_time, port, artifact, argv
        (a list) and placement (a dict, or None where an older fitbox recorded it)."""

        def select(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            rows = conn.execute(
                "SELECT id, pid, create_time, port, artifact, argv, placement FROM children"
                " WHERE ended_at IS NULL ORDER BY id"
            )
            return [
                {
                    "row_id": r[0],
                    "pid": r[1],
                    "create_time": r[2],
                    "port": r[3],
                    "artifact": r[4],
                    "argv": _json_or(r[5], []),
                    "placement": _json_or(r[6], None),
                }
                for r in rows
            ]

        result: list[dict[str, Any]] = self.run(select)
        return result

    def operator_action(
        self,
        action: str,
        target: str | None,
        origin: str | None,
        key_id: str | None,
        outcome: str,
        detail: str | None = None,
    ) -> None:
        now = time.time()
        self._submit(
            lambda conn: self._insert(
                conn,
                "operator",
                "operator_actions",
                "INSERT INTO operator_actions (at, action, target, origin, key_id, outcome, detail)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (now, action, target, origin, key_id, outcome, detail),
            )
        )

    def readings(self, rows: list[tuple[Any, ...]]) -> None:
        """Sensor readings (at, device, simulated, total, free, fitbox, busy %, swap free):
        stored without an event, so the change counter does not move; lazily (writer.py
        ``LAZY_S``): a read still sees every reading queued before it."""
        sql = (
            "INSERT INTO resource_log (at, device, simulated, total_bytes, free_bytes, "
            "fitbox_bytes, busy_percent, swap_free_bytes) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self._submit(lambda conn: conn.executemany(sql, rows), keep=False, lazy=True)

    def gpu_process(
        self, device: str, pid: int, change: str, used: int | None, ours: bool, simulated: bool
    ) -> None:
        now = time.time()
        self._submit(
            lambda conn: self._insert(
                conn,
                "gpu-process",
                "gpu_processes",
                "INSERT INTO gpu_processes (at, device, pid, change, used_bytes, ours, simulated) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (now, device, pid, change, used, int(ours), int(simulated)),
            )
        )

    def forget_readings(self, older_than: float) -> None:
        self._submit(
            lambda conn: conn.execute("DELETE FROM resource_log WHERE at < ?", (older_than,)),
            keep=False,
        )

    def evicted(
        self,
        model: str,
        artifact: str,
        devices: dict[str, int],
        reason: str,
        for_model: str | None = None,
        call_id: int | None = None,
        idle_seconds: float | None = None,
    ) -> None:
        now = time.time()
        self._submit(
            lambda conn: self._insert(
                conn,
                "eviction",
                "evictions",
                "INSERT INTO evictions (at, model, artifact, devices, reason, for_model, call_id, "
                "idle_seconds) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    now,
                    model,
                    artifact,
                    json.dumps(devices),
                    reason,
                    for_model,
                    call_id,
                    idle_seconds,
                ),
            )
        )

    def pulled(
        self,
        source: str,
        path: str | None,
        size: int | None,
        verified: bool,
        outcome: str,
        detail: str | None = None,
        seconds: float | None = None,
    ) -> None:
        now = time.time()
        self._submit(
            lambda conn: self._insert(
                conn,
                "pull",
                "pulls",
                "INSERT INTO pulls (at, source, path, bytes, verified, outcome, detail, seconds) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (now, source, path, size, int(verified), outcome, detail, seconds),
            )
        )

    def scouted(self, rows: list[tuple[Any, ...]]) -> None:
        """Scout's findings (path, name, bytes, source, evidence, led_by, servable, detail),
        an event each, so a central's mirror replays them (migrations/0016)."""
        now, sql = (
            time.time(),
            (
                "INSERT INTO scout_findings (at, path, name, bytes, source, evidence, led_by, "
                "servable, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
            ),
        )
        self._submit(
            lambda conn: [
                self._insert(conn, "scout", "scout_findings", sql, (now, *r)) for r in rows
            ]
        )


def _json_or(text: str | None, default: Any) -> Any:
    """A column's JSON, or ``default`` where it is missing or damaged."""
    try:
        return json.loads(text) if text else default
    except ValueError:
        return default
