"""Admission: a call joins a resident, places a new one, or waits for room.

The placement lock (the registry's) covers the decision only. A decision that evicts marks
its victims ``stopping`` and registers the new resident ``starting`` (its bytes are then
reserved), all under the lock; stopping the victims and loading the child happen after
the lock is released, in a task the supervisor owns. Calls wait on the resident's
``ready`` future. Freed room goes to waiting calls in admission order (core/admission.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from fitbox.config import Config
from fitbox.core.ask import Ask
from fitbox.core.claims import widened
from fitbox.core.decide import decide
from fitbox.core.decision import Place, Refuse, Wait
from fitbox.core.slots import Demand, admits
from fitbox.core.types import WEIGHTS_IN_RAM, Device, ResidentState
from fitbox.engines.kinds import EngineKinds
from fitbox.errors import EngineFailed, ModelBusy, ShuttingDown
from fitbox.models.catalog import Artifact

from . import launches, planning
from .asks import Asks, Named
from .lease import Lease
from .resident import Resident
from .residents import Registry
from .snapshot import Snapshots
from .supervision import Supervisor
from .tasks import Tasks
from .waiting import Waiter, WaitingRoom, waiter_eta

log = logging.getLogger(__name__)
S = ResidentState
READY_SLACK_S = 30  # a call waits for a load this much past the load timeout


def _cells_said(waiter: Waiter | None) -> str:
    """What a call that waited for cells needed of its model's shared pool, in words."""
    cells = waiter.cells if waiter is not None else None
    if not cells:
        return ""
    return (
        f"; it needs {cells['need']} of the {cells['pool']} KV cells the model's calls share "
        f"and {cells['held']} were held (send a smaller max_tokens, or retry)"
    )


@dataclass(frozen=True)
class _Asked:
    """What one call asks of admission: its window need and the reply's part of it, its
    slots (``n``) and what it may hold of a shared pool of cells."""

    need: int
    max_tokens: int
    slots: int
    demand: Demand | None
    work: float | None = None  # a task call's units of work (box/task_speeds.py)


class Admission:
    def __init__(
        self,
        config: Config,
        registry: Registry,
        asks: Asks,
        snapshots: Snapshots,
        supervisor: Supervisor,
        engines: EngineKinds,
        tasks: Tasks,
    ) -> None:
        self.config, self.registry, self.asks, self.snapshots = config, registry, asks, snapshots
        self.supervisor, self.engines, self.tasks = supervisor, engines, tasks
        self.waiting = WaitingRoom()
        self.closing = False
        # movers (box/movers.py): a model's file moved before its load, and after its first
        self.before_load: Callable[[Named, int | None], Awaitable[Named]] | None = None
        self.after_load: Callable[[Artifact], None] | None = None

    def policy(self) -> str:
        return str(self.asks.prefs.effective()["admission"])

    async def acquire(
        self,
        name: str | Named,
        call_id: int | None = None,
        need: int = 1,
        max_tokens: int = 0,
        slots: int = 1,
        demand: Demand | None = None,
        work: float | None = None,
    ) -> Lease:
        """Find or load the model ``name`` and hold ``slots`` of its slots for one call (a
        call asking for ``n`` choices takes ``n``), and the cells of its shared pool
        ``demand`` may come to hold (None: a call that generates nothing). A load that
        runs out of memory refuses its window; the call is placed once more against that
        fact (a smaller window or the next rung), in the same request. ``name`` comes
        parsed (``Named``) from a call that resolved it when it opened (box/serving.py);
        ``work``: a task call's units, its ETA while it waits (box/task_speeds.py)."""
        asked = _Asked(need, max_tokens, slots, demand, work)
        named = name if isinstance(name, Named) else self.asks.named(name)
        if self.before_load is not None and self.joinable(named) is None:
            named = await self.before_load(named, call_id)
        try:
            lease = await self._acquire(named, call_id, asked)
            if lease.loaded and self.after_load is not None:
                self.after_load(lease.resident.artifact)
            return lease
        except EngineFailed as exc:
            if not exc.detail.get("out_of_memory"):
                raise
            log.warning("placing '%s' again after an out-of-memory load", named.asked)
            return await self._acquire(named, call_id, asked)

    async def _acquire(self, named: Named, call_id: int | None, asked: _Asked) -> Lease:
        if self.closing:
            raise ShuttingDown("fitbox is shutting down; retry against the restarted service")
        self.supervisor.refuse_if_failed(named.first)
        max_wait = float(self.asks.knobs(named)["max_wait"])
        deadline = time.monotonic() + max_wait
        if not any(a.key in self.registry for a in named.artifacts):  # crash-loop backoff
            # a decision reads the engine's CPU features and abilities (4-bit)
            await self.engines.prepare(named.artifacts)
            if self.asks.catalog.rejudge():  # that probe told the scan what the engine loads
                named = self.asks.named(named.asked)  # a folder it cannot: refused, its reason
            delay = self.supervisor.restart_delay(named.first)
            if delay > 0:
                await asyncio.sleep(min(delay, max_wait))
                self.supervisor.refuse_if_failed(named.first)
        lease = await self._admitted(named, call_id, asked, deadline, max_wait)
        try:
            async with asyncio.timeout(self.config.load_timeout + READY_SLACK_S):
                await asyncio.shield(lease.resident.ready)
        except BaseException:
            lease.release()
            raise
        return lease

    async def _admitted(
        self,
        named: Named,
        call_id: int | None,
        asked: _Asked,
        deadline: float,
        max_wait: float,
    ) -> Lease:
        """Decide under the lock until a lease is had; wait for changes in between."""
        waiter: Waiter | None = None
        try:
            while True:
                async with self.registry.lock:
                    lease, blockers = self._decide(named, call_id, waiter, asked)
                    changed = self.registry.change()
                if lease is not None:
                    return lease
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ModelBusy(
                        f"'{named.asked}' waited for models that are serving calls or being "
                        f"reloaded ({', '.join(blockers)}); they did not make way within "
                        f"{max_wait:.0f} s{_cells_said(waiter)}",
                        blockers=blockers,
                        retry_after=self._busy_for(blockers, max_wait),
                    )
                if waiter is None:
                    eta = waiter_eta(
                        self.asks.speeds,
                        self.asks.facts,
                        named.first,
                        asked.max_tokens,
                        asked.work,
                    )
                    waiter = self.waiting.enter(named.first.name, call_id, remaining, max_wait, eta)
                waiter.blocked_by = blockers
                waiter.cells = self._cells_wanted(named, asked)
                # asyncio.timeout, not wait_for: on Python 3.11 a wait_for whose wait has
                # just ended swallows a cancel that comes with it, and a call whose client
                # left would wait out its whole max_wait
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await changed.wait()
        finally:
            self.waiting.leave(waiter)
            if self.waiting:
                self.registry.notify()  # the next in line may go now

    def _cells_wanted(self, named: Named, asked: _Asked) -> dict[str, int] | None:
        """What a waiting call needs of its resident's shared pool, and what is held of it
        now (/v1/queue shows it); None where the pool is not what it waits for (a slot, a
        load, a reload)."""
        resident = self.joinable(named)
        pool = resident.slots.pool(resident.window) if resident is not None else None
        if resident is None or pool is None or asked.demand is None:
            return None
        need, held = resident.cells_for(asked.demand), resident.cells_taken
        return None if admits(pool, held, need) else {"need": need, "pool": pool, "held": held}

    def eta(self, waiter: Waiter) -> float | None:
        """Seconds until a waiting call is expected answered: its blockers' calls ended at
        their measured rates, then its own reply; None when any of it is unmeasured."""
        ends = [r.eta_idle() for r in self.registry if r.artifact.name in waiter.blocked_by]
        if any(e is None for e in ends) or waiter.output is None:
            return None
        return max((e for e in ends if e is not None), default=0.0) + waiter.output

    def _busy_for(self, blockers: list[str], waited: float) -> float:
        """Seconds until the blockers are expected idle (their calls' measured ends), or the
        wait the call had when any of them is unmeasured: when a retry may find room."""
        etas = [r.eta_idle() for r in self.registry if r.artifact.name in blockers]
        known = [eta for eta in etas if eta is not None]
        return max(known) if etas and len(known) == len(etas) else waited

    def joinable(self, named: Named) -> Resident | None:
        """A resident that serves ``named`` as asked (any approved variant, pins honoured)."""
        for artifact in named.artifacts:
            resident = self.registry.get(artifact.key)
            if resident is not None and named.admits(artifact, resident.rung):
                return resident
        return None

    def _decide(
        self,
        named: Named,
        call_id: int | None,
        waiter: Waiter | None,
        asked: _Asked,
    ) -> tuple[Lease | None, list[str]]:
        """Under the lock: join a resident, place a new one, or say who blocks."""
        slots, need, max_tokens = asked.slots, asked.need, asked.max_tokens
        existing = self.joinable(named)
        if existing is not None and self.settings_changed(existing):
            return None, [existing.artifact.name]  # loaded again as its settings say now
        if existing is not None:  # the hot path: no pricing for a model already loaded
            if existing.state is S.STOPPING or self._outgrown(existing, max(need - max_tokens, 0)):
                return None, [existing.artifact.name]
            cells = existing.cells_for(asked.demand)
            if not existing.has_room(slots, cells) or self._slot_waiter_ahead(named, waiter):
                return None, [existing.artifact.name]  # slots and cells free when calls end
            self.registry.join(existing, slots, cells)
            return Lease(existing, self.registry, slots=slots, cells=cells), []
        ask = self.asks.ask(named, need=need, max_tokens=max_tokens)
        devices = self.snapshots.devices()  # one probe reading: pricing, deciding, labelling
        decision = decide(self.snapshots.snapshot(devices), ask)
        names = {a.key: a.name for a in named.artifacts}
        names.update({r.key: r.artifact.name for r in self.registry})
        if isinstance(decision, Refuse):
            raise planning.refusal_error(decision, names, named.first)
        if isinstance(decision, Wait):
            return None, [names.get(k, k) for k in decision.blockers]
        ahead = self.waiting.ahead_of(waiter, self.policy())
        if decision.victims and ahead:
            return None, ahead  # freed room goes to the calls admitted first
        loaded = self.registry.get(decision.artifact)
        if loaded is not None:  # the same file under another contract (rung, pins)
            why = f"loading it again as {decision.rung.value} (it was {loaded.rung.value})"
            return None, self._reload_when_idle(loaded, why)
        return self._place(named, decision, ask, devices, call_id, asked), []

    def _slot_waiter_ahead(self, named: Named, waiter: Waiter | None) -> bool:
        """Whether a call for the same model waits ahead of this one: a slot that frees
        goes to the first in admission order, not to whoever asks next."""
        return named.first.name in self.waiting.ahead_of(waiter, self.policy())

    def _place(
        self,
        named: Named,
        decision: Place,
        ask: Ask,
        devices: list[Device],
        call_id: int | None,
        asked: _Asked,
    ) -> Lease:
        """Apply a placement: victims leave, the new resident is registered and brought up."""
        victims = [r for v in decision.victims if (r := self.registry.get(v.key))]
        for victim in victims:
            self.registry.move(victim, S.STOPPING)
        for key in decision.cores_from:  # an idle engine whose cores this claim takes
            if (holder := self.registry.get(key)) is not None:
                self._take_cores(holder, decision.cores)
        device = next(d for d in devices if d.id == decision.device)
        artifact = next(a for a in named.artifacts if a.key == decision.artifact)
        resident = Resident(
            artifact=artifact,
            device=decision.device,
            footprint=planning.summed(f for _, f in decision.footprint),
            window=decision.window,
            parallel=decision.slots,
            simulated=device.simulated,
            engine=self.engines.for_artifact(artifact),
            basis=planning.basis(decision, ask)[decision.artifact],
            loaded_by_call=call_id,
            place=decision,
            held={d: f.total for d, f in decision.footprint},
            asked=named.family,
            band=int(self.asks.knobs(named)["band"]),
            embeddings=bool(self.asks.knobs(named)["embeddings"]),
            cpus=self.snapshots.cpus_of(decision.cores),
        )
        self.registry.add(resident)
        cells = resident.cells_for(asked.demand)  # alone on it: capped at its pool, it fits
        self.registry.join(resident, asked.slots, cells)
        self.tasks.spawn(self.supervisor.bring_up(resident, victims))
        evicted = [v.artifact.name for v in victims]
        return Lease(resident, self.registry, evicted, loaded=True, slots=asked.slots, cells=cells)

    def _take_cores(self, holder: Resident, taken: tuple[int, ...]) -> None:
        """Under the lock: a claim takes cores of the idle ``holder`` (FORMULAS.md §CPU
        claims). With a core per thread left its threads are re-pinned to what it keeps.
        With fewer (its ``-t`` is fixed at launch, and llama.cpp's threads crowded onto fewer
        cores wait on each other's spin barriers: a 3-token call went from 0.05 s to 9 s) it
        is launched again with a thread per core it keeps: the same file and contract, it
        stays resident. On a one-core box, where it would keep none, it keeps its CPUs."""
        holder.lost_cores |= set(taken)
        kept = self.snapshots.cores_kept(holder.cores)
        holder.cpus = self.snapshots.cpus_of(kept)
        if len(holder.cpus) >= holder.threads:
            self.supervisor.repin(holder)
        elif kept and holder.place is not None and holder.state is S.READY:
            log.info(
                "%s starts again with %d thread(s): %d would crowd the core(s) %s a claim left it",
                holder.artifact.name,
                len(kept),
                holder.threads,
                list(kept),
            )
            self.registry.move(holder, S.STOPPING)  # no call joins it while it relaunches
            successor = holder.relaunched(
                replace(holder.place, cores=kept), holder.cpus, self._embeddings(holder)
            )
            self.tasks.spawn(self.supervisor.relaunch(holder, successor))
        else:
            holder.cpus = self.snapshots.cpus_of(holder.place.cores if holder.place else ())

    def wider_claim(self, resident: Resident) -> tuple[int, ...] | None:
        """Under the lock: the larger claim an idle engine with weights in RAM would get if it
        were loaded now (core/claims.py ``widened``), else None. It was launched on fewer
        threads while other work ran or another engine held cores; llama-server alone would
        run a thread per core (issue 14: 0.93-0.97x its decode after a swap beside other
        work)."""
        if resident.place is None or resident.rung not in WEIGHTS_IN_RAM:
            return None
        if not self.snapshots.busy.settled():
            return None  # not while other work may come back at once
        if resident.threads >= len(self.snapshots.claimable_cores()):
            return None  # every core already: no ask built, no snapshot read (every second)
        ask = self.asks.ask(self.asks.named(resident.asked or resident.artifact.name))
        mine = next((c for c in ask.candidates if c.key == resident.key), None)
        speeds = mine.speeds_on(resident.rung) if mine else None
        snapshot = self.snapshots.snapshot()
        return widened(
            snapshot.cores,
            snapshot.busy_cores,
            snapshot.residents,
            resident.key,
            resident.threads,
            floor=ask.cpu_floor,
            threads=speeds.threads if speeds else (),
            lend=snapshot.lend_reserved,
        )

    def widen(self, resident: Resident, cores: tuple[int, ...]) -> None:
        """Under the lock: launch idle ``resident`` again with a thread per core of ``cores``,
        the same file and contract; a call for it waits for that load."""
        assert resident.place is not None
        log.info(
            "%s starts again with %d thread(s) on core(s) %s: it ran %d and they are free now",
            resident.artifact.name,
            len(cores),
            list(cores),
            resident.threads,
        )
        self.registry.move(resident, S.STOPPING)  # no call joins it while it relaunches
        cpus = self.snapshots.cpus_of(cores)
        successor = resident.relaunched(
            replace(resident.place, cores=cores), cpus, self._embeddings(resident)
        )
        self.tasks.spawn(self.supervisor.relaunch(resident, successor))

    def _knobs_of(self, resident: Resident) -> Any:
        return self.asks.settings_for(resident.asked or resident.artifact.name, [resident.artifact])

    def _embeddings(self, resident: Resident) -> bool:
        """Whether a relaunch of ``resident`` serves embeddings: as its settings say now,
        not as it was launched (one turned off stays off across a thread change)."""
        return launches.embeddings_wanted(resident, self._knobs_of(resident))

    def settings_changed(self, resident: Resident) -> bool:
        """Under the lock: a ready, idle ``resident`` whose settings now give another launch
        is loaded again, and True (a call for it waits for that): in place when only the
        engine's flags change (``embeddings``), else it leaves and the next call places it
        again (``rungs``, ``kv_types``, ``quant``; a pinned one stays until unpinned). One
        serving a call is never touched: it runs on, and is loaded again once idle."""
        if resident.state is not S.READY or resident.calls or resident.place is None:
            return False
        knobs = self._knobs_of(resident)
        why = launches.in_place(resident, knobs)
        if why is not None:
            log.info("%s starts again: %s", resident.artifact.name, why)
            self.registry.move(resident, S.STOPPING)  # no call joins it while it relaunches
            place = replace(resident.place, cores=resident.cores or resident.place.cores)
            wanted = launches.embeddings_wanted(resident, knobs)
            successor = resident.relaunched(place, resident.cpus, wanted)
            self.tasks.spawn(self.supervisor.relaunch(resident, successor))
            return True
        why = launches.placed(resident, knobs)
        if why is None or resident.pinned:
            return False
        self._reload_when_idle(resident, f"{why}: placing it again")
        return True

    def _outgrown(self, resident: Resident, prompt: int) -> bool:
        """A prompt larger than a slot of the loaded window needs the model loaded again with a
        larger one (a new contract). Never while a call is on it: an idle, unpinned resident
        is stopped now and the call is placed again; otherwise the call waits (bounded)."""
        slots = resident.slots
        slot = slots.window_each(resident.window)
        trained = resident.artifact.facts.shape.n_ctx_train
        if prompt <= slot or (trained and slot >= slots.window_each(trained)):
            return False
        if trained and prompt > trained:
            return False  # no window could hold it: the engine says so, nothing is reloaded
        self._reload_when_idle(
            resident,
            f"a {prompt}-token prompt outgrows its {slot}-token "
            "slot; loading it again with a larger window",
        )
        return True

    def _reload_when_idle(self, resident: Resident, why: str) -> list[str]:
        """A new contract for a loaded file: an idle, unpinned resident is stopped now (the
        waiting call is placed again once it is gone); a busy one is never stopped, the call
        waits for it (bounded). The blockers to report either way."""
        if resident.state is S.READY and not resident.calls and not resident.pinned:
            log.info("%s: %s", resident.artifact.name, why)
            self.registry.move(resident, S.STOPPING)
            self.tasks.spawn(self.supervisor.stop(resident, "contract_change"))
        return [resident.artifact.name]

    def larger_window(self, resident: Resident) -> int | None:
        """The window ``resident`` would get if it were loaded now, with itself gone and
        nobody else evicted, when that is larger than the one it has; else None."""
        ask = self.asks.ask(self.asks.named(resident.asked or resident.artifact.name))
        if resident.window >= ask.window:  # no band goes past the preferred window
            return None  # (core/bands.py), so no decision is needed: this runs every second
        snapshot = self.snapshots.snapshot()
        others = tuple(r for r in snapshot.residents if r.key != resident.key)
        decision = decide(replace(snapshot, residents=others), ask)
        if (
            isinstance(decision, Place)
            and decision.artifact == resident.key
            and not decision.victims
            and decision.window > resident.window
        ):
            return decision.window
        return None
