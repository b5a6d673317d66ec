"""What loads have taught the box: measured footprints and refused windows.

A measured footprint is filed under the file's identity (path, size, mtime), the place it
was loaded (a device, or a placement class) and its contract (window, slots, cache types);
it replaces the estimate for the same key from then on, and outlives a restart in the
store. It records the vision projector loaded beside the model, if any: a model paired
with a projector since is priced from it plus the projector's estimate, and one whose
projector was replaced or removed since is not priced from it (``priced``). A load that
ran out of memory refuses its window on that place (DESIGN.md
principle 2) until a load at or above it succeeds. A refused window another box measured
for a file with the same bytes (imported) counts the same until this box has loaded, or
been refused, on that place itself.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

from fitbox.core.projector import with_projector
from fitbox.core.types import Footprint
from fitbox.engines.seam import Held
from fitbox.models.catalog import Artifact
from fitbox.models.identity import Identity, identity_of
from fitbox.store.db import MeasuredFootprint, Store
from fitbox.store.facts import ImportedWindow

MeasuredKey = tuple[str, int, int, str, int, int, str, str]


@dataclass(frozen=True)
class Contract:
    """How a model is loaded: the terms that change what it costs."""

    window: int
    parallel: int
    type_k: str = "f16"
    type_v: str = "f16"


def measurement(
    held: Held,
    identity: Identity,
    device: str,
    contract: Contract,
    load_seconds: float | None,
    call_id: int | None,
    now: float,
    estimate: tuple[int, str] | None = None,
    projector: str | None = None,
) -> MeasuredFootprint:
    """What a child reported it holds, as the footprint filed for its key."""
    return MeasuredFootprint(
        artifact=identity.path,
        artifact_size=identity.size,
        artifact_mtime_ns=identity.mtime_ns,
        device=device,
        window=contract.window,
        parallel=contract.parallel,
        type_k=contract.type_k,
        type_v=contract.type_v,
        weights=held.weights,
        kv=held.kv,
        compute=held.compute,
        output=held.output,
        n_ctx=held.n_ctx,
        n_ctx_seq=held.n_ctx_seq,
        load_seconds=load_seconds,
        call_id=call_id,
        measured_at=now,
        estimate_bytes=estimate[0] if estimate else None,
        estimate_basis=estimate[1] if estimate else None,
        projector=projector,
    )


def priced(m: MeasuredFootprint, artifact: Artifact) -> Footprint | None:
    """What a measurement says ``artifact`` costs now: as measured when it was loaded with
    the projector it has now; plus the projector's estimate (core/projector.py) when it
    was measured without one and one is paired since; None when it was measured with a
    projector the model no longer launches with (replaced or removed): the estimate stands
    until the next load measures it."""
    measured = Footprint(m.weights, m.kv, m.compute, m.output)
    now = artifact.projector_identity()
    if m.projector == now:
        return measured
    if m.projector is None and artifact.projector is not None:
        return with_projector(measured, artifact.projector)
    return None


class Facts:
    def __init__(self, store: Store | None, measured: list[MeasuredFootprint] | None = None):
        self.store = store
        if measured is None:
            measured = store.measured_footprints() if store else []
        self.measured: dict[MeasuredKey, MeasuredFootprint] = {m.key: m for m in measured}
        self._refused: dict[str, set[tuple[str, int]]] = {}  # file -> (where, window)
        # file -> (where, window) -> the box whose load was refused there
        self._imported_refused: dict[str, dict[tuple[str, int], str]] = {}
        for (path, size, mtime_ns, where, window), origin in (
            store.refused_windows() if store else []
        ):
            with contextlib.suppress(OSError):  # a file replaced since then starts afresh
                if identity_of(path) == (path, size, mtime_ns):
                    self._file_refusal(path, where, window, origin)

    def _file_refusal(self, path: str, where: str, window: int, origin: str | None) -> None:
        if origin is None:
            self._refused.setdefault(path, set()).add((where, window))
        else:
            self._imported_refused.setdefault(path, {})[(where, window)] = origin

    def refusals(self, artifact: Artifact) -> dict[tuple[str, int], str | None]:
        """The refused windows that count for this file, each with the box whose load was
        refused (None: this one). Another box's refusal counts on a place only until this
        box has a measurement of its own there (a load, or a refusal): it keeps the box from
        trying that window first, and from then on the box's own facts decide (and, as for
        its own, a load at or above a window lifts it: core/ask.py window_cap)."""
        own = self._refused.get(artifact.key, set())
        places = {where for where, _ in own} | {
            m.device
            for m in self.measured.values()
            if m.artifact == artifact.key and m.origin_box is None
        }
        found: dict[tuple[str, int], str | None] = {
            refusal: origin
            for refusal, origin in self._imported_refused.get(artifact.key, {}).items()
            if refusal[0] not in places
        }
        found.update(dict.fromkeys(own))
        return found

    def refused(self, artifact: Artifact) -> set[tuple[str, int]]:
        return set(self.refusals(artifact))

    def of(self, identity: Identity, parallel: int) -> list[MeasuredFootprint]:
        """Every footprint measured for this file at this many slots."""
        return [
            m for m in self.measured.values() if m.key[:3] == identity and m.parallel == parallel
        ]

    def load_seconds(self, artifact: Artifact) -> float | None:
        """How long a measured load of this file took (any place), if one was measured."""
        found = next(
            (m for k, m in self.measured.items() if k[0] == artifact.key and m.load_seconds), None
        )
        return found.load_seconds if found else None

    def footprint_measured(
        self,
        held: Held,
        artifact: Artifact,
        device: str,
        contract: Contract,
        load_seconds: float | None,
        call_id: int | None,
        estimate: tuple[int, str] | None = None,
    ) -> MeasuredFootprint | None:
        """File what a child reports it holds; None when the file is gone since.
        ``estimate``: the bytes it was placed at and their basis, kept beside it."""
        try:
            identity = artifact.identity()
        except OSError:
            return None
        measured = measurement(
            held,
            identity,
            device,
            contract,
            load_seconds,
            call_id,
            time.time(),
            estimate,
            artifact.projector_identity(),
        )
        self.measured[measured.key] = measured
        if self.store is not None:
            self.store.footprint_measured(measured)
        return measured

    def footprint_imported(self, measured: MeasuredFootprint) -> None:
        """File a footprint another box measured for a file with these bytes (its key is
        this box's file). It prices the next placement unless this box measured the same key
        itself: a measurement made here wins. An offer taken before is kept once (store)."""
        here = self.measured.get(measured.key)
        if here is None or here.origin_box is not None:
            self.measured[measured.key] = measured
        if self.store is not None:
            self.store.footprint_imported(measured)

    def measurement(
        self, identity: Identity, parallel: int, where: str, window: int, type_k: str, type_v: str
    ) -> MeasuredFootprint | None:
        """The footprint that prices this placement, if one was measured (here or imported)."""
        return self.measured.get((*identity, where, window, parallel, type_k, type_v))

    def window_imported(self, window: ImportedWindow) -> None:
        """File a window another box's load was refused at, for a file with these bytes (its
        key is this box's file): it keeps this box from trying that window first."""
        path, _, _, where, tokens = window.key
        self._file_refusal(path, where, tokens, window.origin_box)
        if self.store is not None:
            self.store.window_imported(window)

    def window_refused(
        self,
        artifact: Artifact,
        where: str,
        contract: Contract,
        said: str | None,
        call_id: int | None,
    ) -> None:
        self._refused.setdefault(artifact.key, set()).add((where, contract.window))
        if self.store is not None:
            self.store.window_refused(
                artifact.path,
                where,
                contract.window,
                contract.type_k,
                contract.type_v,
                said,
                call_id,
            )
