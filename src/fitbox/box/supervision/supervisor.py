"""Bring-up, stop and exit of engine children, and what their loads teach.

A resident registered ``starting`` (box/admit.py, under the placement lock) is brought up
here, outside the lock: its victims are stopped, the device's memory is awaited, the child
is launched through its engine's seam, waited for, measured, and moved to ``ready``. A
child that exits on its own, hangs, or fails to load is counted in the crash ledger unless
the cause was the room (out of memory), the engine (none installed) or the box itself (an
OSError launching it: a full drive, no fork): a resource failure is not the model's crash.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from fitbox.config import Config
from fitbox.core.fourbit import FOUR_BIT_CLASS
from fitbox.core.repack import NO_REPACK_CLASS
from fitbox.core.types import Footprint, ResidentState, Rung
from fitbox.engines.adopted import AdoptedChild
from fitbox.engines.child import Child, ChildExited, ChildTimeout, free_port, launchers
from fitbox.engines.orphans import start_time
from fitbox.engines.seam import Engine, EngineNotFound, LaunchIntent
from fitbox.errors import EngineFailed, ShuttingDown
from fitbox.models.catalog import Artifact
from fitbox.probe.gpus import GpuProbe
from fitbox.store.db import Store
from fitbox.units import format_bytes

from ..facts import Contract, Facts
from ..resident import Resident
from ..residents import Registry
from ..tasks import Tasks
from .adoption import Judged, adopt_all, placement_of
from .crashes import CrashLedger
from .logs import ChildLogs
from .memory import await_free
from .pagecache import warm
from .pinning import pin_threads

log = logging.getLogger(__name__)
S = ResidentState


def contract_of(resident: Resident) -> Contract:
    return Contract(resident.window, resident.parallel, resident.type_k, resident.type_v)


def intent_for(resident: Resident, port: int, warmup: str = "on") -> LaunchIntent:
    """``warmup`` auto: no warmup run when a call waits for this load (its first token does
    the same work; bench/swap.py), one for a preload, a pin or an operator's load."""
    place, facts = resident.place, resident.artifact.facts
    assert place is not None
    return LaunchIntent(
        model_path=resident.artifact.path,
        alias=resident.artifact.name,
        window=resident.window,
        parallel=resident.parallel,
        embedding=facts.is_embedding or resident.embeddings,
        reranking=facts.is_reranker,
        pooling="mean" if resident.embeddings and not facts.is_embedding else "",
        gpu_layers=place.gpu_layers,
        port=port,
        tensor_split=place.tensor_split,
        experts_in_ram=place.experts_in_ram,
        gpus=tuple(int(d.removeprefix("gpu")) for d in place.devices if d.startswith("gpu")),
        threads=len(place.cores) or None,
        type_k=place.type_k,
        type_v=place.type_v,
        no_repack=place.no_repack,
        kv_unified=place.kv_unified,
        load_in_4bit=place.load_in_4bit,
        warmup=warmup == "on" or (warmup == "auto" and resident.loaded_by_call is None),
        vision=resident.artifact.vision,
        mmproj=resident.artifact.mmproj,
    )


class Supervisor:
    def __init__(
        self,
        config: Config,
        registry: Registry,
        facts: Facts,
        gpus: GpuProbe,
        store: Store | None,
        tasks: Tasks,
        cpus_of: Callable[[tuple[int, ...]], frozenset[int]] = lambda cores: frozenset(),
    ) -> None:
        """``cpus_of``: the logical CPUs of physical cores (box/snapshot.py), for cores given
        back when a claim ends."""
        self.config, self.registry, self.facts = config, registry, facts
        self.gpus, self.store, self.tasks, self.cpus_of = gpus, store, tasks, cpus_of
        self.crashes = CrashLedger(config.crash_limit, config.crash_window, config.crash_backoff)
        launchers()  # found and checked now, not inside the first load's clock
        self.started_pids: set[int] = set()  # every engine pid this fitbox started
        self.logs = ChildLogs(config.log_dir, config.log_retention, config.log_max)

    # -- crashes ---------------------------------------------------------------------

    def refuse_if_failed(self, artifact: Artifact) -> None:
        failed = self.crashes.failed(artifact.key)
        if failed is not None:
            raise EngineFailed(
                f"'{artifact.name}' is marked failed after {failed.crashes} crashes "
                f"(last: {failed.reason}). Fix the cause, then clear it with POST "
                f'/v1/operator/clear-failed {{"model": "{artifact.name}"}}.',
                log_tail=failed.log_tail,
                code="engine_failed",
            )

    def restart_delay(self, artifact: Artifact) -> float:
        """Seconds a crashed model waits before it is loaded again (crash-loop backoff)."""
        return self.crashes.wait_before_restart(artifact.key, time.time())

    def _crashed(self, resident: Resident, reason: str, tail: list[str]) -> None:
        failed = self.crashes.crashed(resident.key, reason, tail, time.time())
        if failed is not None:
            log.error(
                "%s marked failed after %d crashes; calls get engine_failed until an "
                "operator clears it",
                resident.artifact.name,
                failed.crashes,
            )

    # -- bring-up --------------------------------------------------------------------

    async def bring_up(self, resident: Resident, victims: Iterable[Resident]) -> None:
        try:
            victims = list(victims)
            warm(resident.artifact.path)  # read while the victims stop and the child spawns
            for victim in victims:
                log.info(
                    "evicting %s (idle) to make room for %s",
                    victim.artifact.name,
                    resident.artifact.name,
                )
                # idle (no call can join a leaving resident): nothing to finish, no grace
                await self.stop(
                    victim, "make_room", resident.artifact.name, resident.loaded_by_call, grace=0
                )
            if victims:
                await self._memory_back(resident)
            child = await self._launch(resident)
            resident.load_seconds = await child.wait_ready(self.config.load_timeout)
            resident.ready_at = time.time()
            if resident.state is not S.STARTING:
                return  # stopped while it loaded: the stopper owns it now
            await self._measure(resident, child)
            self.registry.move(resident, S.READY)
            self._child_ready(resident, child)
            log.info(
                "%s ready on port %d in %.2f s",
                resident.artifact.name,
                child.port,
                resident.load_seconds,
            )
            resident.ready.set_result(None)
            self.tasks.spawn(self._watch(resident))
        except Exception as exc:
            await self._fail(resident, exc)
        finally:
            self.registry.notify()

    async def _launch(self, resident: Resident) -> Child:
        try:
            # in a thread: a transformers engine not probed yet imports torch in a
            # subprocess there (seconds, minutes on a busy box), and the loop serves meanwhile
            await asyncio.to_thread(resident.engine.locate)
        except EngineNotFound as exc:
            raise EngineFailed(str(exc)) from None
        spec = resident.engine.launch(intent_for(resident, free_port(), self.config.warmup))
        await asyncio.to_thread(self.logs.prune, self.running_logs())  # before one more
        child = Child(
            list(spec.argv),
            spec.port,
            self._log_path(resident, spec.port),
            resident.cpus,
            dict(spec.env),
        )
        resident.child = child
        resident.load_started_at = time.time()
        await child.start()
        self._child_started(resident, child)
        return child

    async def _measure(self, resident: Resident, child: Child) -> None:
        """Read what the engine allocated; it replaces the estimate, now and next time."""
        place = resident.place
        if place is not None and (
            len(place.devices) > 2
            or (len(place.devices) > 1 and place.rung not in (Rung.GPU_ONLY, Rung.FOUR_BIT))
        ):
            return  # measured per placement class: one device (a GPU with its host part) only
        held = await resident.engine.held(child)
        if held is None:
            log.warning(
                "%s: no buffer sizes reported; keeping the estimate", resident.artifact.name
            )
            return
        estimate, basis = resident.footprint.total, resident.basis
        resident.footprint = Footprint(held.weights, held.kv, held.compute, held.output)
        resident.basis = "measured"
        resident.held[resident.device] = resident.footprint.total
        resident.held_now = held.now  # a cache that grows: only what it holds yet
        where = (
            resident.device
            + (NO_REPACK_CLASS if place and place.no_repack else "")
            + (FOUR_BIT_CLASS if place and place.load_in_4bit else "")
        )
        self.facts.footprint_measured(
            held,
            resident.artifact,
            where,
            contract_of(resident),
            resident.load_seconds,
            resident.loaded_by_call,
            (estimate, basis),
        )
        error = (estimate - resident.footprint.total) / max(resident.footprint.total, 1)
        log.info(
            "%s measured %s on %s (the estimate was %+.1f%%)",
            resident.artifact.name,
            format_bytes(resident.footprint.total),
            resident.device,
            error * 100,
        )

    async def _fail(self, resident: Resident, exc: Exception) -> None:
        if isinstance(exc, EngineFailed):
            error = exc
        else:
            tail = exc.tail if isinstance(exc, ChildExited | ChildTimeout) else []
            error = EngineFailed(
                f"{resident.engine.name} could not load '{resident.artifact.name}': {exc}",
                log_tail=tail,
            )
        log.error("%s failed to load: %s", resident.artifact.name, error.message)
        if resident.child is not None:
            await resident.child.stop(self.config.stop_grace)
            self._child_ended(resident, "failed to load")
        tail = error.detail.get("log_tail", [])
        said = resident.engine.out_of_memory(tail)
        if resident.state is S.STARTING:  # not stopped by someone else meanwhile
            if isinstance(exc, OSError):  # launching it: no room, no fork, no descriptor
                log.warning(
                    "%s: not counted as a crash: the box, not the model, failed (%s)",
                    resident.artifact.name,
                    exc,
                )
            elif not isinstance(exc, EngineFailed) and said is None:
                self._crashed(resident, error.message, tail)  # the model, not engine or room
            if said is not None:
                self._refuse_window(resident, error, said)
            self.registry.move(resident, S.FAILED)
            self.give_back_cores(resident)
        if not resident.ready.done():
            resident.ready.set_exception(error)

    def _refuse_window(self, resident: Resident, error: EngineFailed, said: str) -> None:
        """A load out of memory is a fact about this placement: refuse this window."""
        error.detail["out_of_memory"] = True
        where = resident.place.where if resident.place else resident.device
        self.facts.window_refused(
            resident.artifact, where, contract_of(resident), said, resident.loaded_by_call
        )
        log.warning(
            "%s ran out of memory at a %d-token window on %s; windows at or above it "
            "are out of reach until one loads",
            resident.artifact.name,
            resident.window,
            where,
        )

    async def _memory_back(self, resident: Resident) -> None:
        """On a real GPU, wait (bounded) for the evicted children's VRAM to be released."""

        def free_on_device() -> int | None:
            for gpu in self.gpus.read():
                if f"gpu{gpu.index}" == resident.device and not gpu.simulated:
                    return gpu.free
            return None  # host RAM is back when the process is reaped; simulated GPUs too

        recovered, waited = await await_free(free_on_device, resident.footprint.total)
        if not recovered:
            log.warning(
                "%s: %s memory not back after %.1f s; loading anyway",
                resident.artifact.name,
                resident.device,
                waited,
            )

    # -- running and stopping -------------------------------------------------------------

    async def _watch(self, resident: Resident) -> None:
        """A ready child that exits on its own is dropped, so the next call reloads it."""
        assert resident.child is not None
        code = await resident.child.wait_exit()
        if resident.state is S.READY and self.registry.holds(resident):
            log.error("%s exited unexpectedly with code %s", resident.artifact.name, code)
            self._child_ended(resident, f"exited with code {code}")
            self.registry.move(resident, S.FAILED)
            self.give_back_cores(resident)
            self._crashed(resident, f"exited unexpectedly with code {code}", resident.child.tail())

    async def hung(self, resident: Resident, idle: float) -> None:
        """A ready engine that stopped answering mid-call: stop it (the ladder ends in SIGKILL
        for the group), drop it so the next call loads it again, count it as one crash
        however many calls found it silent."""
        if resident.state is not S.READY or not self.registry.holds(resident):
            return  # another call already found it hung
        log.error(
            "%s hung: nothing for %.0f s to any call, no answer to /health and no CPU "
            "time; restarting it",
            resident.artifact.name,
            idle,
        )
        tail = resident.child.tail() if resident.child else []
        await self.stop(resident, "hung")
        self._crashed(resident, f"hung mid-call (nothing for {idle:.0f} s)", tail)

    async def stop(
        self,
        resident: Resident,
        reason: str | None = None,
        for_model: str | None = None,
        call_id: int | None = None,
        grace: float | None = None,
    ) -> None:
        """Stop a resident; with a ``reason`` it is an eviction, recorded as one. ``grace``:
        seconds between SIGTERM and SIGKILL (default ``stop_grace``; 0 for an idle victim)."""
        if reason is not None and self.store is not None:
            self.store.evicted(
                resident.artifact.name,
                str(resident.artifact.path),
                resident.holdings(),
                reason,
                for_model,
                call_id,
                time.monotonic() - resident.last_used,
            )
        if resident.state in (S.STARTING, S.READY):
            self.registry.move(resident, S.STOPPING)
        if resident.state is not S.STOPPING:
            return  # already gone
        if resident.child is not None:
            await resident.child.stop(self.config.stop_grace if grace is None else grace)
            self._child_ended(resident, "stopped")
        if resident.state is S.STOPPING:
            self.registry.move(resident, S.STOPPED)
            self.give_back_cores(resident)
        if not resident.ready.done():  # stopped while loading: wake whoever waits for it
            resident.ready.set_exception(
                ShuttingDown(f"'{resident.artifact.name}' was stopped while it loaded")
            )

    async def relaunch(self, old: Resident, successor: Resident) -> None:
        """``old`` (idle, moved to ``stopping`` under the lock) leaves and ``successor``, the
        same file and contract on other threads (fewer: a claim took cores; more: they came
        free, box/warmth.py), takes its place: SIGKILL (idle, nothing to finish), then,
        under the lock, the one swapped for the other, so a call for the model waits for
        the successor's load and never finds the file unplaced."""
        if old.child is not None:
            await old.child.stop(0)
            self._child_ended(old, f"relaunched on {successor.threads} thread(s)")
        async with self.registry.lock:
            if old.state is not S.STOPPING or not self.registry.holds(old):
                return  # a close stopped it meanwhile
            self.registry.move(old, S.STOPPED)
            self.registry.add(successor)
        await self.bring_up(successor, [])

    def give_back_cores(self, leaving: Resident) -> None:
        """``leaving``'s claim ended: every engine a claim took cores from gets back those
        no other engine holds now, and its threads move back onto them."""
        held = {core for r in self.registry if r is not leaving for core in r.cores}
        for holder in self.registry:
            back = holder.lost_cores - held
            if holder is leaving or not back or holder.state is not S.READY:
                continue
            holder.lost_cores -= back
            holder.cpus = self.cpus_of(holder.cores)
            self.repin(holder, f"core(s) {sorted(back)} given back: the claim that took them ended")

    def repin(self, resident: Resident, why: str = "a claim took the others") -> None:
        """A later claim took some of this idle engine's cores (or gave them back): its
        threads move to the CPUs it has now (``resident.cpus``), so two engines never
        compute on one core."""
        pid = resident.child.pid if resident.child and resident.child.alive else None
        if pid is None or not resident.cpus:
            return
        moved = pin_threads(pid, resident.cpus)
        log.info(
            "%s: %d thread(s) re-pinned to CPUs %s (%s)",
            resident.artifact.name,
            moved,
            sorted(resident.cpus),
            why,
        )

    def kill_all_now(self) -> None:
        for resident in self.registry:
            if resident.child is not None:
                resident.child.kill_now()

    # -- the children's records -------------------------------------------------------

    def _child_started(self, resident: Resident, child: Child) -> None:
        if child.pid is None:
            return
        self.started_pids.add(child.pid)
        if self.store is None:
            return
        resident.child_start_time = start_time(child.pid) or 0.0
        self.store.child_started(
            child.pid,
            resident.child_start_time,
            child.port,
            str(resident.artifact.path),
            child.argv,
        )

    def _child_ready(self, resident: Resident, child: Child) -> None:
        if self.store is not None and child.pid:
            self.store.child_ready(child.pid, resident.child_start_time, placement_of(resident))

    def _child_ended(self, resident: Resident, how: str) -> None:
        if self.store is not None and resident.child is not None and resident.child.pid:
            self.store.child_ended(resident.child.pid, resident.child_start_time, how)

    def adopt_or_reap(
        self, find: Callable[[str], Artifact | None], engine_for: Callable[[Artifact], Engine]
    ) -> list[Judged]:
        """Children an earlier image or fitbox left running: each adopted as a ready
        resident, or reaped, or closed as gone (box/supervision/adoption.py). ``find``: the
        catalog's artifact at a path."""
        return adopt_all(self, find, engine_for)

    async def adopted_runs(self, resident: Resident, child: AdoptedChild) -> None:
        await child.start()  # its output pipe, where a re-exec handed one over
        await self._watch(resident)

    def hand_over(self) -> dict[int, int]:
        """Before a re-exec: every ready child is left running for the new image to adopt
        (its record stays open), every other one is stopped now. Returns the output pipes
        handed over, by pid (-1: none)."""
        pipes: dict[int, int] = {}
        for resident in list(self.registry):
            child = resident.child
            if resident.state is S.READY and child is not None and child.alive and child.pid:
                fd = child.hand_over()
                pipes[child.pid] = -1 if fd is None else fd
        return pipes

    def running_logs(self) -> list[Path]:
        """The log files of the children alive now (never pruned)."""
        return [r.child.log_path for r in self.registry if r.child is not None and r.child.alive]

    def _log_path(self, resident: Resident, port: int) -> Path:
        return self.artifact_log(resident.artifact, port)

    def artifact_log(self, artifact: Artifact, port: int) -> Path:
        safe = re.sub(r"[^A-Za-z0-9._-]+", "_", artifact.name)
        return self.config.log_dir / f"{safe}-{port}.log"
