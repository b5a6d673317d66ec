"""Facts measured on the box (or imported from another): footprints, refused windows and
speeds, filed as rows of the store (their SQL in store/facts.py) and read back at start."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from fitbox.store import facts
from fitbox.store.facts import MeasuredFootprint, MeasuredSpeed, RefusedWindowKey
from fitbox.store.queue import Queued


class FactRows(Queued):
    """The measured facts' writes (queued) and reads (run on the writer's connection)."""

    def footprint_measured(self, measured: MeasuredFootprint) -> None:
        self._submit(
            lambda conn: self._event(
                conn, "fact", "measured_footprints", facts.insert_footprint(conn, measured)
            )
        )

    def footprint_imported(self, measured: MeasuredFootprint) -> None:
        """A footprint another box measured, with its origin; an offer taken before: no row."""
        self._imported("measured_footprints", lambda conn: facts.import_footprint(conn, measured))

    def window_imported(self, window: facts.ImportedWindow) -> None:
        """A window another box's load was refused at; an offer taken before: no row."""
        self._imported("refused_windows", lambda conn: facts.import_refused_window(conn, window))

    def speed_imported(self, speed: MeasuredSpeed) -> None:
        """A speed another box measured, with its origin; an offer taken before: no row."""
        self._imported("measured_speeds", lambda conn: facts.import_speed(conn, speed))

    def _imported(self, table: str, insert: Callable[[sqlite3.Connection], int | None]) -> None:
        def job(conn: sqlite3.Connection) -> None:
            if (row_id := insert(conn)) is not None:
                self._event(conn, "fact", table, row_id)

        self._submit(job)

    def window_refused(
        self,
        artifact: Path,
        placement: str,
        window: int,
        type_k: str,
        type_v: str,
        detail: str | None,
        call_id: int | None,
    ) -> None:
        try:
            stat = artifact.stat()
        except OSError:
            return
        key = (str(artifact), stat.st_size, stat.st_mtime_ns, placement, window)
        now = time.time()
        self._submit(
            lambda conn: self._event(
                conn,
                "fact",
                "refused_windows",
                facts.insert_refused_window(conn, key, type_k, type_v, detail, call_id, now),
            )
        )

    def refused_windows(self) -> list[tuple[RefusedWindowKey, str | None]]:
        """(artifact, size, mtime_ns, placement, window) of every refused window, with the
        box that measured it (None: this one)."""
        try:
            result: list[tuple[RefusedWindowKey, str | None]] = self.run(facts.refused_windows)
        except sqlite3.Error:
            return []
        return result

    def speed_measured(self, speed: MeasuredSpeed) -> None:
        self._submit(
            lambda conn: self._event(
                conn, "fact", "measured_speeds", facts.insert_speed(conn, speed)
            )
        )

    def recent_speeds(self) -> list[MeasuredSpeed]:
        """The last 20 speeds of every (file, rung), oldest first (read once, at start)."""
        try:
            result: list[MeasuredSpeed] = self.run(facts.recent_speeds)
        except sqlite3.Error:
            return []
        return result

    def recent_curve(self) -> list[facts.CurvePoint]:
        """The thread curve's last points per (file, rung), oldest first (read at start)."""
        try:
            result: list[facts.CurvePoint] = self.run(facts.recent_curve)
        except sqlite3.Error:
            return []
        return result

    def measured_footprints(self) -> list[MeasuredFootprint]:
        """The newest measurement of every placement key (read once, at start)."""
        future = self._submit(facts.latest_footprints, wait=True)
        assert future is not None
        try:
            result: list[MeasuredFootprint] = future.result(timeout=30)
        except sqlite3.Error:
            return []
        return result
