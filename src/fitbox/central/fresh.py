"""What the central knows of each box now, worked out when it is read: the fleet page and
``GET /v1/fleet`` both show it, from the same functions.

A box's residents snapshot (``/v1/residents``) is read again only on a change that is not a
call's, so its ``calls``, ``slots_taken`` and ``idle_for_s`` are as old as that change
(minutes on a quiet box). What does not move with calls (model, state, device, bytes,
window, ``parallel``) is taken from it; the rest from the mirrored rows, which a call's
start and end bring at once: a resident is serving while a ``call_log`` row of its file is
``pending``, and idle since the newest of its calls' last bytes and its engine's start
(``idle_since``: a reader counts from there, at the time it reads). Memory per device is
the newest mirrored ``resource_log`` reading of each device (the mirror takes readings at
least every ``READINGS_EVERY_S`` while the box answers), each with the moment it was read."""

from __future__ import annotations

import time
from typing import Any

from fitbox.central.mirror import BoxLink
from fitbox.central.page_html import DeviceReading
from fitbox.central.store import CentralStore

ROWS = 20  # calls, loads and evictions the page shows, across the boxes
CALLS_READ = 200  # per box: enough to find each resident's newest call for its idle time
READINGS_READ = 50  # per box: the newest resource reading of each device is among them
TABLES = {
    "call_log": CALLS_READ,
    "children": ROWS,
    "evictions": ROWS,
    "resource_log": READINGS_READ,
}

Rows = dict[str, list[dict[str, Any]]]  # a box's newest mirrored rows, by table


def recent_rows(store: CentralStore, box_ids: list[str]) -> dict[str, Rows]:
    """Per box, its newest mirrored rows of the tables these views read."""
    return {
        box_id: {
            table: store.mirrored(table, box_id, most, 0, True) for table, most in TABLES.items()
        }
        for box_id in box_ids
    }


def no_rows() -> Rows:
    return {table: [] for table in TABLES}


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def fresh(resident: dict[str, Any], rows: Rows) -> dict[str, Any]:
    """The box's snapshot of a resident with what its mirrored rows say now: ``calls``, its
    calls still open (the snapshot's count is as of the last change that was not a call's),
    and ``idle_since``, the newest of its calls' last bytes and its engine's start."""
    artifact = resident.get("artifact")
    calls = [c for c in rows["call_log"] if c.get("artifact") == artifact]
    stamps = [c["last_byte_at"] for c in calls if _number(c.get("last_byte_at"))]
    stamps += [
        c["started_at"]
        for c in rows["children"]
        if c.get("artifact") == artifact
        and c.get("ended_at") is None
        and _number(c.get("started_at"))
    ]
    return {
        **resident,
        "calls": sum(1 for c in calls if c.get("outcome") == "pending"),
        "idle_since": float(max(stamps)) if stamps else None,
    }


def devices(link: BoxLink, readings: list[dict[str, Any]]) -> list[DeviceReading]:
    """Memory per device: total and free from its newest reading (or the box's /health),
    held from what its residents hold now."""
    held: dict[str, int] = {}
    for resident in link.residents:
        for device, size in (resident.get("devices") or {}).items():
            held[device] = held.get(device, 0) + int(size)
    newest: dict[str, dict[str, Any]] = {}
    for reading in readings:  # newest first
        newest.setdefault(str(reading.get("device")), reading)
    totals = {f"gpu{g.get('index')}": g.get("total_bytes") for g in link.health.get("gpus", [])}
    names = sorted({*newest, *totals, *held}, key=lambda d: (d != "host", d))
    return [
        DeviceReading(
            name,
            newest.get(name, {}).get("total_bytes") or totals.get(name),
            newest.get(name, {}).get("free_bytes"),
            held.get(name, 0),
            newest.get(name, {}).get("at"),
        )
        for name in names
    ]


def _age(at: float | None, now: float) -> float | None:
    return None if at is None else round(max(0.0, now - at), 3)


def _resident_now(resident: dict[str, Any], rows: Rows, now: float) -> dict[str, Any]:
    found = fresh(resident, rows)
    calls, since = found["calls"], found["idle_since"]
    parallel = int(found.get("parallel") or 1)
    return {
        **found,
        "slots_taken": min(calls, parallel),
        "slots_free": max(0, parallel - calls),
        "idle_for_s": (_age(since, now) if since is not None else None) if not calls else 0,
    }


def box_now(link: BoxLink, rows: Rows, now: float | None = None) -> dict[str, Any]:
    """One box as ``GET /v1/fleet`` shows it: its record and state, its residents with their
    calls, slots and idle time counted now, its memory per device from the newest reading,
    and when each was read (``*_at``, epoch seconds; ``*_age_s`` at ``read_at``)."""
    now = time.time() if now is None else now
    waiting_at = link.synced_at  # the queue length comes with every long-poll answer
    return {
        **link.describe(),
        "read_at": now,
        "devices": [
            {
                "device": d.device,
                "total_bytes": d.total,
                "free_bytes": d.free,
                "held_bytes": d.held,
                "read_at": d.read_at,
                "age_s": _age(d.read_at, now),
            }
            for d in devices(link, rows["resource_log"])
        ],
        "residents": [_resident_now(r, rows, now) for r in link.residents],
        "residents_read_at": link.snapshot_at,  # what does not move with calls
        "residents_age_s": _age(link.snapshot_at, now),
        "waiting_read_at": waiting_at,
        "waiting_age_s": _age(waiting_at, now),
    }
