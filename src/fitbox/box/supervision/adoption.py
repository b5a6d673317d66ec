"""Adopt or reap the engine children a store records as still running.

A fitbox that re-executes itself (SIGHUP) hands its ready children to the new image; one
SIGKILLed where PR_SET_PDEATHSIG could not act leaves them behind. At start each open
record is judged once: a child is adopted as a ``ready`` resident, without a reload, only
if it is the engine recorded (pid AND process start time AND its command line the argv
recorded, naming the artifact recorded), its artifact is still in the catalog, a placement
was recorded when it turned ready, and its /health answers on the recorded port. Anything
else is reaped (its process group stopped) or, when no such process runs, closed as gone.
A child is never both adopted and reaped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from fitbox.core.decision import Place
from fitbox.core.repack import RepackReason
from fitbox.core.types import Footprint, ResidentState, Rung
from fitbox.engines.adopted import AdoptedChild
from fitbox.engines.orphans import ChildRecord, healthy, reap, runs_as_recorded
from fitbox.engines.seam import Engine
from fitbox.models.catalog import Artifact
from fitbox.store.db import Store

from ..resident import Resident
from ..residents import Registry
from ..tasks import Tasks


class Adopter(Protocol):
    """What adopting needs of the supervisor (box/supervision/supervisor.py)."""

    store: Store | None
    registry: Registry
    tasks: Tasks
    started_pids: set[int]

    def cpus_of(self, cores: tuple[int, ...], /) -> frozenset[int]: ...

    def artifact_log(self, artifact: Artifact, port: int) -> Path: ...

    def adopted_runs(
        self, resident: Resident, child: AdoptedChild
    ) -> Coroutine[Any, Any, None]: ...


log = logging.getLogger(__name__)
PIPES_ENV = "FITBOX_HANDED_PIPES"  # "pid:fd,pid:fd": output pipes a re-exec handed over


def placement_of(resident: Resident) -> dict[str, Any]:
    """What rebuilding ``resident`` as a ready resident needs, as JSON-ready values."""
    place = resident.place
    return {
        "engine": resident.engine.name,
        "device": resident.device,
        "footprint": list(_footprint(resident.footprint)),
        "window": resident.window,
        "parallel": resident.parallel,
        "simulated": resident.simulated,
        "basis": resident.basis,
        "held": dict(resident.held),
        "held_now": resident.held_now,
        "asked": resident.asked,
        "band": resident.band,
        "embeddings": resident.embeddings,
        "pinned": resident.pinned,
        "load_seconds": resident.load_seconds,
        "place": None if place is None else _place(place),
    }


def _footprint(f: Footprint) -> tuple[int, int, int, int]:
    return (f.weights, f.kv, f.compute, f.output)


def _place(place: Place) -> dict[str, Any]:
    return {
        "artifact": place.artifact,
        "rung": place.rung.value,
        "window": place.window,
        "type_k": place.type_k,
        "type_v": place.type_v,
        "devices": list(place.devices),
        "footprint": [[d, list(_footprint(f))] for d, f in place.footprint],
        "gpu_layers": place.gpu_layers,
        "tensor_split": list(place.tensor_split),
        "experts_in_ram": place.experts_in_ram,
        "cores": list(place.cores),
        "where": place.where,
        "repack": place.repack.value,
        "slots": place.slots,
        "kv_unified": place.kv_unified,
        "load_in_4bit": place.load_in_4bit,
    }


def place_from(data: dict[str, Any]) -> Place:
    return Place(
        artifact=str(data["artifact"]),
        rung=Rung(data["rung"]),
        window=int(data["window"]),
        type_k=str(data["type_k"]),
        type_v=str(data["type_v"]),
        devices=tuple(str(d) for d in data["devices"]),
        footprint=tuple((str(d), Footprint(*(int(x) for x in f))) for d, f in data["footprint"]),
        gpu_layers=int(data["gpu_layers"]),
        tensor_split=tuple(float(x) for x in data["tensor_split"]),
        experts_in_ram=bool(data["experts_in_ram"]),
        victims=(),
        cores=tuple(int(c) for c in data["cores"]),
        where=str(data["where"]),
        repack=RepackReason(data["repack"]),
        slots=int(data["slots"]),
        kv_unified=bool(data["kv_unified"]),
        load_in_4bit=bool(data["load_in_4bit"]),
    )


def resident_from(
    data: dict[str, Any], artifact: Artifact, engine: Engine, child: AdoptedChild
) -> Resident:
    """The ready resident ``data`` (``placement_of``) describes, on ``child``."""
    place = None if data.get("place") is None else place_from(data["place"])
    return Resident(
        artifact=artifact,
        device=str(data["device"]),
        footprint=Footprint(*(int(x) for x in data["footprint"])),
        window=int(data["window"]),
        parallel=int(data["parallel"]),
        simulated=bool(data["simulated"]),
        engine=engine,
        child=child,
        basis=str(data["basis"]),
        held={str(d): int(b) for d, b in data["held"].items()},
        held_now=None if data.get("held_now") is None else int(data["held_now"]),
        asked=str(data["asked"]),
        band=int(data["band"]),
        embeddings=bool(data["embeddings"]),
        pinned=bool(data["pinned"]),
        load_seconds=data.get("load_seconds"),
        place=place,
        child_start_time=child._create_time,
    )


@dataclass
class Judged:
    """One open record's fate: adopted (with its resident), reaped, or gone."""

    record: ChildRecord
    resident: Resident | None = None
    how: str = "gone"  # or "reaped at start", "adopted"


def handed_pipes() -> dict[int, int]:
    """The output pipes a re-exec handed over, by pid; read once (the variable is removed,
    so a child fitbox starts never sees it)."""
    pipes: dict[int, int] = {}
    for pair in os.environ.pop(PIPES_ENV, "").split(","):
        pid, _, fd = pair.partition(":")
        if pid.isdigit() and fd.isdigit():
            pipes[int(pid)] = int(fd)
    return pipes


def judge(
    record: ChildRecord,
    find: Callable[[str], Artifact | None],
    engine_for: Callable[[Artifact], Engine],
    log_path: Callable[[Artifact, int], Path],
    pipes: dict[int, int],
) -> Judged:
    """Adopt ``record``'s child if every check passes, else reap it (never both)."""
    why = runs_as_recorded(record)
    artifact = find(record.artifact) if record.artifact else None
    if why is None and artifact is None:
        why = "its artifact is no longer in the catalog"
    if why is None and record.placement is None:
        why = "it never turned ready (no placement recorded)"
    if why is None and not healthy(record.port):
        why = f"its /health does not answer on port {record.port}"
    if why is not None or artifact is None or record.placement is None:
        return _reap(record, why or "unverified", pipes)
    try:
        engine = engine_for(artifact)
        port = int(record.port or 0)
        child = AdoptedChild(
            list(record.argv),
            port,
            log_path(artifact, port),
            record.pid,
            record.create_time,
            pipes.pop(record.pid, None),
        )
        resident = resident_from(record.placement, artifact, engine, child)
    except (KeyError, TypeError, ValueError, LookupError) as exc:
        return _reap(record, f"its recorded placement cannot be read ({exc!r})", pipes)
    return Judged(record, resident, "adopted")


def _reap(record: ChildRecord, why: str, pipes: dict[int, int]) -> Judged:
    fd = pipes.pop(record.pid, None)
    if fd is not None:
        os.close(fd)
    if not reap(record):
        return Judged(record, None, "gone")
    with contextlib.suppress(ChildProcessError):  # handed over by a re-exec: still ours
        os.waitpid(record.pid, os.WNOHANG)
    log.warning("stopped engine pid %d left running by an earlier fitbox: %s", record.pid, why)
    return Judged(record, None, "reaped at start")


def adopt_all(
    sup: Adopter,
    find: Callable[[str], Artifact | None],
    engine_for: Callable[[Artifact], Engine],
) -> list[Judged]:
    """Every open record of ``sup``'s store judged: adopted, reaped or gone."""
    if sup.store is None:
        return []
    pipes = handed_pipes()
    judged = []
    for row in sup.store.open_children():
        record = ChildRecord.of(row)
        done = judge(record, find, engine_for, sup.artifact_log, pipes)
        if done.resident is not None and done.resident.key in sup.registry:
            # a second live engine on a file already adopted: one resident per file
            child = done.resident.child
            if isinstance(child, AdoptedChild) and child._pipe_fd is not None:
                pipes[record.pid] = child._pipe_fd  # closed by _reap
            done = _reap(record, "another engine on its file was adopted first", pipes)
        judged.append(done)
        if done.resident is None:
            sup.store.child_row_ended(record.row_id, done.how)
        else:
            _register(sup, done.resident)
    for fd in pipes.values():  # a pipe no record claimed
        os.close(fd)
    return judged


def _register(sup: Adopter, resident: Resident) -> None:
    child = resident.child
    assert isinstance(child, AdoptedChild)
    sup.registry.add(resident)
    sup.registry.move(resident, ResidentState.READY)
    resident.ready_at = time.time()
    resident.ready.set_result(None)
    resident.cpus = sup.cpus_of(resident.cores)
    sup.started_pids.add(child._pid)
    sup.tasks.spawn(sup.adopted_runs(resident, child))
    log.info(
        "%s adopted on port %d (pid %d): ready, not reloaded",
        resident.artifact.name,
        child.port,
        child._pid,
    )
