"""The box: the runtime's rooms, put together once per process, and the face ``server/`` and
the CLI see.

Who owns what (docs/design/box.md has the whole table):
- ``residents.Registry``: residents, the placement lock, the change signal; alone changes
  a resident's state.
- ``admit.Admission``: a call joins, places or waits (the waiting room).
- ``supervision``: bring-up, readiness, measurement, the hang watchdog, crashes, orphans.
- ``calls.CallDesk``: a call's row from start to measured speeds.
- ``serving.Serving``: a served call from its name to its engine's answer (opened once,
  the name resolved once; placed, sent, placed again on a counted prompt).
- ``warmth.Warmth``: preload, idle TTL, grow-back; ``sensors``: readings into the store.
- ``asks``, ``snapshot``, ``facts``, ``speeds``, ``preferences``: what decisions read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from fitbox.config import Config
from fitbox.core import sizing
from fitbox.core.ask import Ask
from fitbox.core.decide import decide
from fitbox.core.decision import Place
from fitbox.core.repack import CpuFeatures
from fitbox.core.types import ResidentState, Snapshot
from fitbox.engines.kinds import EngineKinds, on_this_box
from fitbox.engines.seam import Abilities, EngineNotFound
from fitbox.errors import FitboxError, InvalidRequest
from fitbox.models.catalog import Artifact, Catalog
from fitbox.probe.gpus import GpuProbe
from fitbox.store.db import MeasuredFootprint, Store
from fitbox.store.settings import read_settings, write_settings
from fitbox.store.waits import write

from . import planning
from .admit import Admission
from .asks import Asks
from .calls import CallDesk
from .facts import Facts, priced
from .lease import Lease
from .movers import Movers
from .needs import Needs
from .operator import Operator
from .preferences import Preferences
from .resident import Resident
from .residents import Registry
from .sensors import sense
from .serving import Serving
from .snapshot import Snapshots
from .speeds import SpeedBook
from .supervision import Supervisor, Watchdog
from .supervision.crashes import CrashLedger
from .supervision.logs import LogFile, LogPiece
from .task_plans import task_plan
from .tasks import Tasks
from .waiting import slot_wait
from .warmth import Warmth

log = logging.getLogger(__name__)


class Box:
    def __init__(
        self,
        config: Config,
        catalog: Catalog,
        gpus: GpuProbe,
        store: Store | None = None,
        measured: list[MeasuredFootprint] | None = None,
        engines: EngineKinds | None = None,
    ) -> None:
        self.config, self.catalog, self.gpus, self.store = config, catalog, gpus, store
        self.prefs = Preferences(config)
        if store is not None:
            with contextlib.suppress(Exception):  # a damaged store serves on with defaults
                self.prefs.restore(store.run(read_settings))
        self.registry, self.tasks = Registry(), Tasks()
        self.handing_over: dict[int, int] | None = None  # a re-exec's (close() fills it)
        self.facts, self.speeds = Facts(store, measured), SpeedBook(store)
        self.engines = engines or on_this_box(config.engine_dir, config.home)
        self.asks = Asks(
            config, catalog, self.prefs, self.facts, self.speeds, self._cpu, self._abilities
        )
        self.snapshots = Snapshots(
            gpus, self.registry, self.prefs, config.cpu_busy_percent, config.cpu_busy_readings
        )
        self.supervisor = Supervisor(
            config, self.registry, self.facts, gpus, store, self.tasks, self.snapshots.cpus_of
        )
        self.watchdog = Watchdog(self.supervisor, config.engine_idle_timeout)
        self.admission = Admission(
            config,
            self.registry,
            self.asks,
            self.snapshots,
            self.supervisor,
            self.engines,
            self.tasks,
        )
        self.movers = Movers(config, catalog, self.registry, self.prefs, store, self.tasks)
        if self.movers.on("upload_to_worker"):
            self.admission.before_load = self.movers.before_load
        if self.movers.on("copy_to_central") or self.movers.on("upload_to_worker"):
            self.admission.after_load = self.movers.after_load
        self.operator = Operator(catalog, self.registry, self.admission, self.supervisor)
        self.needs = Needs(config.parallel, self.asks, self.admission)
        self.warmth = Warmth(
            config, self.registry, self.asks, self.admission, self.supervisor, self.operator
        )
        self._calls = (
            CallDesk(store, self.speeds, self.watchdog, self.admission.acquire) if store else None
        )
        self.serving = Serving(
            self._calls,
            catalog,
            self.asks,
            self.needs,
            self.engines,
            self.registry,
            self.supervisor.crashes,
            config.default_model,
        )

    def _cpu(self, artifact: Artifact) -> CpuFeatures | None:
        """The CPU features of the engine that would load ``artifact`` (read once per binary)."""
        try:
            return self.engines.for_artifact(artifact).cpu_features()
        except FitboxError:
            return None

    def _abilities(self, artifact: Artifact) -> Abilities:
        """What the engine that would load ``artifact`` can do beyond a whole load."""
        try:
            return self.engines.for_artifact(artifact).abilities()
        except FitboxError:
            return Abilities()  # no engine serves it: the call fails on that, not here

    @property
    def calls(self) -> CallDesk:
        assert self._calls is not None, "calls are recorded: a box that serves has a store"
        return self._calls

    # -- reading -----------------------------------------------------------------------

    def residents(self) -> list[Resident]:
        return list(self.registry)

    def queue(self) -> list[dict[str, Any]]:
        """Calls waiting for room, in admission order (core/admission.py)."""
        admission = self.admission
        waiting = [
            {**w.view(), "eta_s": admission.eta(w)}
            for w in admission.waiting.ordered(admission.policy())
        ]
        return waiting + self.movers.queue()

    def queue_etas(self) -> dict[str, float | None]:
        """Per ready resident, by model: the seconds a new call would wait for one of its
        slots, from the measured ends of its calls and of those waiting before it (None:
        one of them is not measured, or overdue; box/waiting.py slot_wait). A central compares them
        with another box's load to decide a spill."""
        now = time.monotonic()
        waiting = self.admission.waiting.ordered(self.admission.policy())
        etas: dict[str, float | None] = {}
        for resident in self.registry:
            if resident.state is not ResidentState.READY:
                continue
            # a call past its expected end (an engine stopped, a slower decode) says nothing
            # of when it ends: unknown, as an unmeasured one
            ends = [
                None if e is None or e <= now else e - now for e in resident.expected_ends.values()
            ]
            ends += [None] * max(0, resident.calls - len(ends))  # a call not yet priced
            ahead = [w.output for w in waiting if w.model == resident.artifact.name]
            free = resident.at_once - resident.slots_taken
            etas[resident.artifact.name] = slot_wait(ends, free, ahead)
        return etas

    @property
    def crashes(self) -> CrashLedger:
        return self.supervisor.crashes

    def snapshot(self) -> Snapshot:
        return self.snapshots.snapshot()

    def physical_cores(self) -> dict[int, frozenset[int]]:
        return self.snapshots.physical_cores()

    def claimable_cores(self) -> tuple[int, ...]:
        return self.snapshots.claimable_cores()

    # -- calls and operator actions --------------------------------------------------------

    async def acquire(
        self,
        name: str,
        call_id: int | None = None,
        need: int = 1,
        max_tokens: int = 0,
        slots: int = 1,
    ) -> Lease:
        return await self.admission.acquire(name, call_id, need, max_tokens, slots)

    async def load(self, name: str) -> Resident:
        return await self.operator.load(name)

    async def pin(self, name: str, pinned: bool = True) -> Resident:
        return await self.operator.pin(name, pinned)

    async def unload(self, name: str) -> Resident:
        return await self.operator.unload(name)

    def clear_failed(self, name: str) -> bool:
        return self.operator.clear_failed(name)

    def child_logs(self) -> list[LogFile]:
        """The engine children's log files, newest first (box/supervision/logs.py)."""
        return self.supervisor.logs.files(self.supervisor.running_logs())

    def child_log(self, name: str, offset: int | None, tail_lines: int) -> LogPiece | None:
        return self.supervisor.logs.read(name, offset, tail_lines)

    # -- settings --------------------------------------------------------------------------

    async def update_settings(self, scope: str, model: str, values: dict[str, Any]) -> None:
        """Persist, then apply: a knob the store could not keep (or did not keep in time:
        ``StoreBusy``, store/waits.py) is not applied."""
        if self.store is not None:
            await write(
                self.store,
                lambda conn: write_settings(conn, scope, model, values),
                "keep the setting",
            )
        self.prefs.apply(scope, model, values)
        if scope == "limits":
            self.warmth.limits_changed()  # a lowered cap evicts idle residents down to it
        self.registry.notify()

    def problems(self) -> list[str]:
        """What the box knows is wrong now: residents over a lowered cap."""
        return list(self.warmth.cap_problems)

    # -- plans -----------------------------------------------------------------------------

    def ask_for(self, name: str, all_kv: bool = False) -> tuple[Ask, list[Artifact]]:
        """The ask a call for ``name`` would make; ``all_kv`` adds the common quantized
        caches after the configured ones (for verdicts: a band per K/V type)."""
        named = self.asks.named(name)
        return self.asks.ask(named, all_kv=all_kv), list(named.artifacts)

    def plan_for(
        self,
        name: str,
        ctx: int | None = None,
        parallel: int | None = None,
        kv: str | None = None,
        max_tokens: int = 0,
    ) -> dict[str, Any]:
        """What the box would do for ``name`` now, without doing it (``fitbox plan``)."""
        named = self.asks.named(name)
        ask = self.asks.ask(named, window=ctx, parallel=parallel, kv=kv, max_tokens=max_tokens)
        first = named.first
        problem = kv and sizing.kv_type_problem(first.facts.shape, kv, kv, flash_attn=True)
        if problem:
            raise InvalidRequest(f"'{first.name}' cannot use a {kv} cache: {problem}", param="kv")
        snapshot = self.snapshots.snapshot()
        decision = decide(snapshot, ask)
        names = {a.key: a.name for a in named.artifacts}
        names.update({r.key: r.artifact.name for r in self.registry})
        chosen = next(
            (
                a
                for a in named.artifacts
                if isinstance(decision, Place) and a.key == decision.artifact
            ),
            first,
        )
        report = planning.report(decision, snapshot, names, planning.basis(decision, ask))
        if isinstance(decision, Place) and report["basis"] == "measured":
            report.update(self._measured_by(chosen, ask.parallel, decision))
        if isinstance(decision, Place):  # boxes whose speeds price its ETA in place of its own
            report["speeds_measured_by"] = self.speeds.origins(chosen, decision.rung.value)
        report["refused_windows"] = [  # what caps its windows, and whose load was refused
            {"device": where, "window": window, "origin_box": origin}
            for (where, window), origin in sorted(
                self.facts.refusals(chosen).items(), key=lambda found: found[0]
            )
        ]
        planned = {
            "model": chosen.name,
            "asked": name,
            "artifact": str(chosen.path),
            "architecture": chosen.facts.architecture,
            "quant": chosen.facts.quant,
            "window": report.get("window", ask.window),
            "parallel": ask.parallel,
            "type_k": report.get("type_k", ask.kv_types[0][0]),
            "type_v": report.get("type_v", ask.kv_types[0][1]),
            "variants": [a.name for a in named.artifacts],
            **report,
        }
        if chosen.task is None:
            return planned
        return task_plan(planned, chosen, self.engines.for_artifact(chosen), self.speeds.tasks)

    def _measured_by(self, artifact: Artifact, parallel: int, place: Place) -> dict[str, Any]:
        """Where a measured placement's bytes come from: a load here (its call), or another
        box's load of a file with the same bytes (basis "imported", with that box's id)."""
        try:
            identity = artifact.identity()
        except OSError:
            return {}
        found = self.facts.measurement(
            identity, parallel, place.where, place.window, place.type_k, place.type_v
        )
        if found is None or priced(found, artifact) is None:
            return {}  # none, or measured with a projector it no longer launches with
        source = {
            "box_id": found.origin_box,
            "row_id": found.origin_id,
            "call_id": found.call_id,
            "measured_at": found.measured_at,
        }
        return {"basis": "imported" if found.origin_box else "measured", "measured_by": source}

    # -- life ------------------------------------------------------------------------------

    def reap_orphans(self) -> int:
        """Children an earlier image or fitbox left running: adopted as ready residents
        where verified, else reaped (box/supervision/adoption.py). Returns how many were
        adopted."""
        by_path = {str(a.path): a for a in self.catalog.artifacts()}
        judged = self.supervisor.adopt_or_reap(by_path.get, self.engines.for_artifact)
        return sum(j.resident is not None for j in judged)

    def start(self) -> None:
        """Background work: preload and pinned models, the idle-TTL unloader, the sensors."""
        self.tasks.spawn(self.engines.prepare())  # probed before the first call asks
        self.tasks.spawn(self.judge_folders())
        self.tasks.spawn(self.warmth.warm_up())
        self.tasks.spawn(self.warmth.unload_idle())
        self.tasks.spawn(
            sense(
                self.config,
                self.registry,
                self.gpus,
                self.store,
                self.supervisor.started_pids,
                self.snapshots.busy,
            )
        )

    async def judge_folders(self) -> None:
        """Each engine located off the loop (the transformers engine's probe imports torch
        once and records what its transformers loads); then the catalog scans again if that
        changed, so a folder it cannot load is refused before a call evicts anything."""
        for kind in self.engines.kinds:
            with contextlib.suppress(EngineNotFound, FitboxError, OSError):
                await asyncio.to_thread(kind.locate)
        self.catalog.rejudge()

    async def close(self) -> None:
        """Stop every child, each bounded by the stop ladder; before a re-exec
        (``handing_over``) the ready ones are left running for the new image instead."""
        self.admission.closing = True
        began = time.monotonic()
        await self.tasks.cancel_all()
        log.info("stopping: background tasks ended after %.2f s", time.monotonic() - began)
        if self.handing_over is not None:
            self.handing_over.update(self.supervisor.hand_over())
        kept = set(self.handing_over or {})
        residents = [r for r in self.registry if not (r.child and r.child.pid in kept)]
        ended = await asyncio.gather(
            *(self.supervisor.stop(r) for r in residents), return_exceptions=True
        )
        for resident, result in zip(residents, ended, strict=True):
            if isinstance(result, BaseException):  # said, never swallowed: a child may live on
                log.error("stopping %s failed: %r", resident.artifact.name, result)

    def kill_all_now(self) -> None:
        self.supervisor.kill_all_now()
