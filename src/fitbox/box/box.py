"""The box: residents, the placement lock, applying plans, leases for calls.

The lock covers the decision only. A decision that evicts marks its victims ``stopping``
and registers the new resident as ``starting`` (its bytes are then reserved), all under the
lock; stopping the victims and loading the child happen after the lock is released, in a
task owned by the new resident. Calls wait on the resident's ``ready`` future.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from fitbox.config import Config
from fitbox.core import sizing
from fitbox.core.ask import Ask
from fitbox.core.decide import decide
from fitbox.core.decision import Decision, Place, Refuse, Wait
from fitbox.core.pins import parse as parse_pins
from fitbox.core.tiers import Tier, capacity
from fitbox.core.types import (
    Device,
    DeviceKind,
    Footprint,
    Goal,
    ResidentState,
    Rung,
    Snapshot,
)
from fitbox.engines.child import Child, ChildExited, ChildTimeout, free_port
from fitbox.engines.llama_server import (
    EngineInfo,
    EngineNotFound,
    LaunchIntent,
    build_argv,
    find_binary,
    inspect,
)
from fitbox.engines.load_log import parse_load_log
from fitbox.engines.orphans import ChildRecord, reap, start_time
from fitbox.errors import (
    Conflict,
    EngineFailed,
    InvalidRequest,
    ModelBusy,
    ShuttingDown,
)
from fitbox.models.catalog import Artifact, Catalog
from fitbox.probe.gpus import GpuProbe
from fitbox.probe.host import physical_cores, read_host
from fitbox.store.db import MeasuredFootprint, Store
from fitbox.units import format_bytes

from . import planning
from .crashes import CrashLedger
from .lease import Lease
from .preferences import Preferences
from .preferences import load as load_preferences
from .preferences import save as save_preferences
from .pricing import Contract, MeasuredKey, measurement
from .recovery import await_free
from .resident import Resident
from .speeds import SpeedBook
from .waiting import WaitingRoom, ticket_eta

log = logging.getLogger(__name__)
T = TypeVar("T")
HEALTH_PROBE_S = 5.0  # how long a hung-looking engine gets to answer /health
VERDICT_KV_TYPES = ("f16", "q8_0", "q4_0")
OOM = re.compile(r"out of memory|failed to allocate|unable to allocate|cudaMalloc failed", re.I)


class Box:
    def __init__(
        self,
        config: Config,
        catalog: Catalog,
        gpus: GpuProbe,
        store: Store | None = None,
        measured: list[MeasuredFootprint] | None = None,
    ) -> None:
        self.config = config
        self.catalog = catalog
        self.gpus = gpus
        self.store = store
        if measured is None:
            measured = store.measured_footprints() if store else []
        self._measured: dict[MeasuredKey, MeasuredFootprint] = {m.key: m for m in measured}
        self._residents: dict[str, Resident] = {}
        self._lock = asyncio.Lock()
        self._changed = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._engine: EngineInfo | None = None
        self._closing = False
        self.evictions = 0
        self.waiting = WaitingRoom()  # calls waiting for room, for /v1/queue
        self.crashes = CrashLedger(config.crash_limit, config.crash_window, config.crash_backoff)
        self._cores = physical_cores()
        self.prefs = Preferences(config)
        if store is not None:
            with contextlib.suppress(Exception):  # a damaged store serves on with defaults
                store.run(lambda conn: load_preferences(conn, self.prefs))
        self._refused: dict[str, set[tuple[str, int]]] = {}  # artifact -> (where, window): OOM
        for path, size, mtime_ns, where, window in store.refused_windows() if store else []:
            with contextlib.suppress(OSError):  # a file replaced since then starts afresh
                stat = Path(path).stat()
                if (stat.st_size, stat.st_mtime_ns) == (size, mtime_ns):
                    self._refused.setdefault(path, set()).add((where, window))
        self.speeds = SpeedBook(store)
        self.child_pids_seen: set[int] = set()  # engine pids this fitbox started (sensors)

    def queue(self) -> list[dict[str, Any]]:
        """Calls waiting for room, in admission order (core/admission.py)."""
        return self.waiting.view(self.prefs.effective()["admission"])

    # -- reading -----------------------------------------------------------------

    def residents(self) -> list[Resident]:
        return list(self._residents.values())

    def is_resident(self, artifact: Artifact) -> bool:
        return artifact.key in self._residents

    def devices(self) -> list[Device]:
        """What each pool can hold now: live free memory plus what our own residents hold."""
        held: dict[str, int] = {}
        for r in self._residents.values():
            for device, size in r.holdings().items():
                held[device] = held.get(device, 0) + size
        devices = []
        for gpu in self.gpus.read():
            device_id = f"gpu{gpu.index}"
            tier = Tier(f"vram:{device_id}", gpu.total, self.prefs.limit("vram_max"))
            # other processes' use is charged to the device: NVML free + what we hold
            unmanaged = (
                0 if gpu.simulated else max(gpu.total - gpu.free - held.get(device_id, 0), 0)
            )
            devices.append(Device(device_id, DeviceKind.GPU, capacity(tier, unmanaged),
                                  gpu.simulated))  # fmt: skip
        # Weights are mmap'd: their pages sit in the page cache, which MemAvailable already
        # counts as available. Only the anonymous parts (KV, compute, output) are added back.
        anonymous = sum(
            r.footprint.total - r.footprint.weights
            for r in self._residents.values()
            if r.device == "host"
        )
        host = read_host()
        tier = Tier("ram", host.mem_total, self.prefs.limit("ram_max"))
        room = min(host.mem_available + anonymous, host.mem_total)
        devices.append(Device("host", DeviceKind.HOST, min(capacity(tier), room)))
        return devices

    def snapshot(self, devices: list[Device] | None = None) -> Snapshot:
        return Snapshot(
            devices=tuple(self.devices() if devices is None else devices),
            residents=tuple(r.view() for r in self._residents.values()),
            cores=self.claimable_cores(),
        )

    def physical_cores(self) -> dict[int, frozenset[int]]:
        return dict(self._cores)

    def claimable_cores(self) -> tuple[int, ...]:
        """Physical cores claims are made from: the cores tier (--cpu-max) counts those
        engines may claim; the lowest stays for fitbox and the OS (core/claims.py)."""
        cores = sorted(self._cores)
        cpu_max = self.prefs.limit("cpu_max")
        if cpu_max is not None:
            cores = cores[: cpu_max + 1]
        return tuple(cores)

    def engine(self) -> EngineInfo:
        if self._engine is None:
            try:
                candidate = find_binary(self.config.engine_dir)
            except EngineNotFound as exc:
                raise EngineFailed(str(exc)) from None
            self._engine = inspect(candidate.path)
        return self._engine

    # -- leasing -----------------------------------------------------------------

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _release(self, resident: Resident) -> None:
        resident.calls -= 1
        resident.last_used = time.monotonic()
        self._notify()

    # -- operator actions ----------------------------------------------------------

    async def load(self, name: str) -> Resident:
        """Load ``name`` now (or find it loaded) and leave it resident and idle."""
        lease = await self.acquire(name)
        lease.release()
        return lease.resident

    async def pin(self, name: str, pinned: bool = True) -> Resident:
        """Pin: load if needed and never evict it. Unpin: evictable again."""
        resident = await self.load(name) if pinned else self._resident_named(name)
        resident.pinned = pinned
        self._notify()
        return resident

    async def unload(self, name: str) -> Resident:
        """Stop ``name`` if it is idle. A model with calls on it is never stopped."""
        resident = self._resident_named(name)
        if resident.calls or resident.state is not ResidentState.READY:
            raise Conflict(
                f"'{resident.artifact.name}' is {resident.state.value} with {resident.calls} "
                "call(s) on it; it is never stopped while serving. Try again when it is idle.",
                param="model",
            )  # fmt: skip
        resident.pinned = False
        await self._stop(resident, "operator")
        return resident

    def _refuse_if_failed(self, artifact: Artifact) -> None:
        failed = self.crashes.failed(artifact.key)
        if failed is not None:
            raise EngineFailed(
                f"'{artifact.name}' is marked failed after {failed.crashes} crashes "
                f"(last: {failed.reason}). Fix the cause, then clear it with POST "
                f"/v1/operator/clear-failed {{\"model\": \"{artifact.name}\"}}.",
                log_tail=failed.log_tail, code="engine_failed",
            )  # fmt: skip

    def clear_failed(self, name: str) -> bool:
        return self.crashes.clear(self.catalog.resolve(name).key)

    def _resident_named(self, name: str) -> Resident:
        artifact = self.catalog.resolve(name)
        resident = self._residents.get(artifact.key)
        if resident is None:
            raise Conflict(f"'{artifact.name}' is not loaded.", param="model",
                           code="not_resident")  # fmt: skip
        return resident

    def _ask(
        self,
        name: str,
        *,
        window: int | None = None,
        parallel: int | None = None,
        kv: str | None = None,
        need: int = 1,
        max_tokens: int = 0,
    ) -> tuple[Ask, list[Artifact]]:
        pins = parse_pins(name)
        artifacts = self.catalog.variants(pins.name)
        parallel = parallel or self.config.parallel
        candidates = tuple(
            planning.candidate(
                a,
                self._measured,
                parallel,
                self._refused.get(a.key, ()),
                {Rung(r): v for r, v in self.speeds.by_rung(a).items()},
            )
            for a in artifacts
        )
        eff = self.settings_for(pins.name, artifacts)
        rungs = tuple(r for r in pins.rungs if r.value in eff["rungs"])
        kv_types = ((kv, kv),) if kv else tuple((k, k) for k in eff["kv_types"])
        made = planning.ask(
            name, pins, candidates, window=window or eff["window"], parallel=parallel,
            need=need, max_wait=eff["max_wait"], kv_types=kv_types, max_tokens=max_tokens,
            cpu_floor=eff["cpu_floor"], goal=Goal(eff["goal"]),
        )  # fmt: skip
        prompt = max(need - max_tokens, 0) if need > 1 else 0
        made = replace(made, rungs=rungs, quant=pins.quant or eff["quant"], prompt_tokens=prompt)
        return made, artifacts

    def ask_for(self, name: str, all_kv: bool = False) -> tuple[Ask, list[Artifact]]:
        """The ask a call for ``name`` would make; ``all_kv`` adds the common quantized
        caches after the configured ones (for verdicts: a band per K/V type)."""
        ask, artifacts = self._ask(name)
        if all_kv:
            extra = [(k, k) for k in VERDICT_KV_TYPES if (k, k) not in ask.kv_types]
            ask = replace(ask, kv_types=(*ask.kv_types, *extra))
        return ask, artifacts

    def settings_for(self, name: str, artifacts: list[Artifact] | None = None) -> dict[str, Any]:
        """Effective knobs for a model: its own (by the name asked, else a variant's name),
        else the box's, else the start-up settings."""
        for key in [name, *(a.name for a in artifacts or [])]:
            if key in self.prefs.pairs:
                return self.prefs.effective(key)
        return self.prefs.effective()

    def update_settings(self, scope: str, model: str, values: dict[str, Any]) -> None:
        """Persist, then apply: a knob the store could not keep is not applied."""
        if self.store is not None:
            self.store.run(lambda conn: save_preferences(conn, scope, model, values))
        self.prefs.apply(scope, model, values)
        self._notify()

    def _basis(self, decision: Decision, ask: Ask) -> dict[str, str]:
        if not isinstance(decision, Place):
            return {}
        chosen = next(c for c in ask.candidates if c.key == decision.artifact)
        found = chosen.measured_fit(decision.where, decision.window, decision.type_k,
                                    decision.type_v)  # fmt: skip
        return {decision.artifact: "measured" if found else "estimate"}

    def plan_for(
        self,
        name: str,
        ctx: int | None = None,
        parallel: int | None = None,
        kv: str | None = None,
        max_tokens: int = 0,
    ) -> dict[str, Any]:
        """What the box would do for ``name`` now, without doing it (``fitbox plan``)."""
        ask, artifacts = self._ask(name, window=ctx, parallel=parallel, kv=kv,
                                   max_tokens=max_tokens)  # fmt: skip
        first = artifacts[0]
        problem = kv and sizing.kv_type_problem(first.facts.shape, kv, kv, flash_attn=True)
        if problem:
            raise InvalidRequest(f"'{first.name}' cannot use a {kv} cache: {problem}", param="kv")
        snapshot = self.snapshot()
        decision = decide(snapshot, ask)
        names = {a.key: a.name for a in artifacts}
        names.update({r.key: r.artifact.name for r in self._residents.values()})
        chosen = next((a for a in artifacts if isinstance(decision, Place)
                       and a.key == decision.artifact), first)  # fmt: skip
        report = planning.report(decision, snapshot, names, self._basis(decision, ask))
        return {
            "model": chosen.name, "asked": name, "artifact": str(chosen.path),
            "architecture": chosen.facts.architecture, "quant": chosen.facts.quant,
            "window": report.get("window", ask.window), "parallel": ask.parallel,
            "type_k": report.get("type_k", ask.kv_types[0][0]),
            "type_v": report.get("type_v", ask.kv_types[0][1]),
            "variants": [a.name for a in artifacts], **report,
        }  # fmt: skip

    async def acquire(
        self, name: str, call_id: int | None = None, need: int = 1, max_tokens: int = 0
    ) -> Lease:
        """Find or load the model ``name`` and hold it for one call. A load that runs out of
        memory refuses its window; the call is placed once more against that fact (a smaller
        window or the next rung), in the same request."""
        try:
            return await self._acquire(name, call_id, need, max_tokens)
        except EngineFailed as exc:
            if not exc.detail.get("out_of_memory"):
                raise
            log.warning("placing '%s' again after an out-of-memory load", name)
            return await self._acquire(name, call_id, need, max_tokens)

    async def _acquire(self, name: str, call_id: int | None, need: int, max_tokens: int) -> Lease:
        if self._closing:
            raise ShuttingDown("fitbox is shutting down; retry against the restarted service")
        artifacts = self.catalog.variants(parse_pins(name).name)
        for artifact in artifacts[:1]:
            self._refuse_if_failed(artifact)
        max_wait = float(self.settings_for(parse_pins(name).name, artifacts)["max_wait"])
        deadline = time.monotonic() + max_wait
        first = artifacts[0]
        if not any(a.key in self._residents for a in artifacts):  # crash-loop backoff
            delay = self.crashes.wait_before_restart(first.key, time.time())
            if delay > 0:
                await asyncio.sleep(min(delay, max_wait))
                self._refuse_if_failed(first)
        lease: Lease | None = None
        ticket = object()
        try:
            while lease is None:
                async with self._lock:
                    lease, blockers = self._decide(name, call_id, ticket, need, max_tokens)
                    changed = self._changed
                if lease is None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise ModelBusy(
                            f"'{name}' waited for models that are serving calls or being "
                            f"reloaded ({', '.join(blockers)}); they did not make way within "
                            f"{max_wait:.0f} s",
                            blockers=blockers,
                        )
                    eta = ticket_eta(self.speeds, self._measured, first, max_tokens)
                    self.waiting.enter(ticket, first.name, call_id, remaining, max_wait, eta)
                    self.waiting.blocked(ticket, blockers)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(changed.wait(), timeout=remaining)
        finally:
            self.waiting.leave(ticket)
            if self.waiting:
                self._notify()  # the next in line may go now
        try:
            await asyncio.wait_for(
                asyncio.shield(lease.resident.ready), timeout=self.config.load_timeout + 30
            )
        except BaseException:
            lease.release()
            raise
        return lease

    def _joinable(self, artifacts: list[Artifact], name: str) -> Resident | None:
        """A resident that serves ``name`` as asked (any approved variant, pins honoured)."""
        pins = parse_pins(name)
        for artifact in artifacts:
            resident = self._residents.get(artifact.key)
            if resident is None or resident.rung not in pins.rungs:
                continue
            if pins.quant and artifact.facts.quant.upper() != pins.quant:
                continue
            return resident
        return None

    def larger_window(self, resident: Resident) -> int | None:
        """The window ``resident`` would get if it were loaded now, with itself gone and
        nobody else evicted, when that is larger than the one it has; else None."""
        ask, _ = self._ask(resident.asked or resident.artifact.name)
        snapshot = self.snapshot()
        others = tuple(r for r in snapshot.residents if r.key != resident.key)
        decision = decide(replace(snapshot, residents=others), ask)
        if (
            isinstance(decision, Place) and decision.artifact == resident.key
            and not decision.victims and decision.window > resident.window
        ):  # fmt: skip
            return decision.window
        return None

    def _outgrown(self, resident: Resident, prompt: int) -> bool:
        """A prompt larger than a slot of the loaded window needs the model loaded again with a
        larger one (a new contract). Never while a call is on it: an idle, unpinned resident
        is stopped now and the call is placed again; otherwise the call waits (bounded)."""
        slot = resident.window // max(resident.parallel, 1)
        trained = resident.artifact.facts.shape.n_ctx_train
        if prompt <= slot or (trained and slot >= trained // max(resident.parallel, 1)):
            return False
        if trained and prompt > trained:
            return False  # no window could hold it: the engine says so, nothing is reloaded
        self._reload_when_idle(resident, f"a {prompt}-token prompt outgrows its {slot}-token "
                               "slot; loading it again with a larger window")  # fmt: skip
        return True

    def _reload_when_idle(self, resident: Resident, why: str) -> list[str]:
        """A new contract for a loaded file: an idle, unpinned resident is stopped now (the
        waiting call is placed again once it is gone); a busy one is never stopped, the call
        waits for it (bounded). The blockers to report either way."""
        if resident.state is ResidentState.READY and not resident.calls and not resident.pinned:
            log.info("%s: %s", resident.artifact.name, why)
            resident.state = ResidentState.STOPPING
            self._spawn(self._stop(resident, "contract_change"))
        return [resident.artifact.name]

    def _decide(
        self, name: str, call_id: int | None, ticket: object, need: int, max_tokens: int
    ) -> tuple[Lease | None, list[str]]:
        """Under the lock: join a resident, place a new one, or say who blocks."""
        existing = self._joinable(self.catalog.variants(parse_pins(name).name), name)
        if existing is not None:  # the hot path: no pricing for a model already loaded
            if existing.state is ResidentState.STOPPING:
                return None, [existing.artifact.name]
            if self._outgrown(existing, max(need - max_tokens, 0)):
                return None, [existing.artifact.name]
            existing.calls += 1
            existing.served += 1
            existing.last_used = time.monotonic()
            return Lease(existing, self), []
        ask, artifacts = self._ask(name, need=need, max_tokens=max_tokens)

        devices = self.devices()  # one probe reading serves pricing, deciding and labelling
        decision = decide(self.snapshot(devices), ask)
        names = {a.key: a.name for a in artifacts}
        names.update({r.key: r.artifact.name for r in self._residents.values()})
        if isinstance(decision, Refuse):
            raise planning.refusal_error(decision, names, artifacts[0])
        if isinstance(decision, Wait):
            return None, [names.get(k, k) for k in decision.blockers]
        ahead = self.waiting.ahead_of(ticket, self.prefs.effective()["admission"])
        if decision.victims and ahead:
            return None, ahead  # freed room goes to the calls admitted first
        loaded = self._residents.get(decision.artifact)
        if loaded is not None:  # the same file under another contract (rung, pins)
            why = f"loading it again as {decision.rung.value} (it was {loaded.rung.value})"
            return None, self._reload_when_idle(loaded, why)

        victims = [self._residents[v.key] for v in decision.victims]
        for victim in victims:
            victim.state = ResidentState.STOPPING
        for key in decision.cores_from:  # an idle engine whose cores this claim takes
            if key in self._residents:
                self._residents[key].lost_cores |= set(decision.cores)
        device = next(d for d in devices if d.id == decision.device)
        artifact = next(a for a in artifacts if a.key == decision.artifact)
        resident = Resident(
            artifact=artifact,
            device=decision.device,
            footprint=_summed(f for _, f in decision.footprint),
            window=decision.window,
            parallel=ask.parallel,
            simulated=device.simulated,
            calls=1,
            served=1,
            basis=self._basis(decision, ask)[decision.artifact],
            loaded_by_call=call_id,
            place=decision,
            held={d: f.total for d, f in decision.footprint},
            asked=parse_pins(name).name,
            band=int(self.settings_for(parse_pins(name).name, artifacts)["band"]),
            cpus=frozenset().union(*(self._cores.get(c, frozenset()) for c in decision.cores)),
        )
        self._residents[artifact.key] = resident
        self._spawn(self._bring_up(resident, victims))
        lease = Lease(resident, self, evicted=[v.artifact.name for v in victims], loaded=True)
        return lease, []

    def _spawn(self, coro: object) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- applying ----------------------------------------------------------------

    async def _bring_up(self, resident: Resident, victims: Iterable[Resident]) -> None:
        try:
            for victim in victims:
                log.info(
                    "evicting %s (idle) to make room for %s",
                    victim.artifact.name,
                    resident.artifact.name,
                )
                self.evictions += 1
                await self._stop(victim, "make_room", resident.artifact.name,
                                 resident.loaded_by_call)  # fmt: skip
            if victims:
                await self._memory_back(resident)
            engine = self.engine()
            port = free_port()
            place = resident.place
            assert place is not None
            intent = LaunchIntent(
                model_path=resident.artifact.path,
                alias=resident.artifact.name,
                window=resident.window,
                parallel=resident.parallel,
                embedding=resident.artifact.facts.is_embedding,
                gpu_layers=place.gpu_layers,
                port=port,
                tensor_split=place.tensor_split,
                experts_in_ram=place.experts_in_ram,
                threads=len(place.cores) or None,
                type_k=place.type_k,
                type_v=place.type_v,
            )
            child = Child(build_argv(engine, intent), port, self._log_path(resident, port),
                          resident.cpus)  # fmt: skip
            resident.child = child
            resident.load_started_at = time.time()
            await child.start()
            self._child_started(resident, child)
            resident.load_seconds = await child.wait_ready(self.config.load_timeout)
            resident.ready_at = time.time()
            self._measure(resident, child)
            resident.state = ResidentState.READY
            log.info(
                "%s ready on port %d in %.2f s", resident.artifact.name, port, resident.load_seconds
            )
            resident.ready.set_result(None)
            self._spawn(self._watch(resident))
        except Exception as exc:
            await self._fail(resident, exc)
        finally:
            self._notify()

    def _measure(self, resident: Resident, child: Child) -> None:
        """Read what the engine allocated; it replaces the estimate, now and next time."""
        place = resident.place
        if (
            place is not None
            and len(place.devices) > 1
            and place.rung not in (Rung.GPU_ONLY, Rung.FOUR_BIT)
        ) or (place is not None and len(place.devices) > 2):
            return  # measured per placement class: one device (a GPU with its host part) only
        contract = Contract(resident.window, resident.parallel, resident.type_k, resident.type_v)
        report = parse_load_log(child.load_log())
        measured = measurement(
            report,
            resident.artifact,
            resident.device,
            contract,
            resident.load_seconds,
            resident.loaded_by_call,
            time.time(),
        )
        if measured is None:
            log.warning(
                "%s: no buffer sizes in its load log; keeping the estimate", resident.artifact.name
            )
            return
        estimate = resident.footprint.total
        resident.footprint = Footprint(
            measured.weights, measured.kv, measured.compute, measured.output
        )
        resident.basis = "measured"
        resident.held[resident.device] = resident.footprint.total
        self._measured[measured.key] = measured
        if self.store is not None:
            self.store.footprint_measured(measured)
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
                f"llama-server could not load '{resident.artifact.name}': {exc}",
                log_tail=tail,
            )
        log.error("%s failed to load: %s", resident.artifact.name, error.message)
        if resident.child is not None:
            await resident.child.stop(self.config.stop_grace)
            self._child_ended(resident, "failed to load")
        tail = error.detail.get("log_tail", [])
        out_of_memory = any(OOM.search(line) for line in tail)
        if not isinstance(exc, EngineNotFound | EngineFailed) and not out_of_memory:
            self._crashed(resident, error.message, tail)  # the model, not the engine or room
        if out_of_memory:  # a fact about this placement: refuse this window next time
            error.detail["out_of_memory"] = True
            where = resident.place.where if resident.place else resident.device
            self._refused.setdefault(resident.key, set()).add((where, resident.window))
            if self.store is not None:
                said = next((line for line in reversed(tail) if OOM.search(line)), None)
                self.store.window_refused(resident.artifact.path, where, resident.window,
                                          resident.type_k, resident.type_v, said,
                                          resident.loaded_by_call)  # fmt: skip
            log.warning("%s ran out of memory at a %d-token window on %s; windows at or above "
                        "it are out of reach until one loads", resident.artifact.name,
                        resident.window, where)  # fmt: skip
        if self._residents.get(resident.key) is resident:
            del self._residents[resident.key]
        if not resident.ready.done():
            resident.ready.set_exception(error)

    async def _watch(self, resident: Resident) -> None:
        """A ready child that exits on its own is dropped, so the next call reloads it."""
        assert resident.child is not None and resident.child.proc is not None
        code = await resident.child.proc.wait()
        if resident.state is ResidentState.READY and self._residents.get(resident.key) is resident:
            log.error("%s exited unexpectedly with code %s", resident.artifact.name, code)
            self._child_ended(resident, f"exited with code {code}")
            del self._residents[resident.key]
            self._crashed(resident, f"exited unexpectedly with code {code}", resident.child.tail())
            self._notify()

    def _child_started(self, resident: Resident, child: Child) -> None:
        if self.store is None or child.pid is None:
            return
        resident.child_start_time = start_time(child.pid) or 0.0
        self.store.child_started(child.pid, resident.child_start_time, child.port,
                                 str(resident.artifact.path), child.argv)  # fmt: skip

    def _child_ended(self, resident: Resident, how: str) -> None:
        if self.store is not None and resident.child is not None and resident.child.pid:
            self.store.child_ended(resident.child.pid, resident.child_start_time, how)

    def reap_orphans(self) -> int:
        """Stop children an earlier fitbox left behind (matched by pid and start time)."""
        if self.store is None:
            return 0
        reaped = 0
        for row_id, pid, created, argv0 in self.store.open_children():
            ours = reap(ChildRecord(row_id, pid, created, argv0))
            reaped += ours
            if ours:
                log.warning("stopped engine pid %d left running by an earlier fitbox", pid)
            self.store.child_row_ended(row_id, "reaped at start" if ours else "gone")
        return reaped

    async def _memory_back(self, resident: Resident) -> None:
        """On a real GPU, wait (bounded) for the evicted children's VRAM to be released."""

        def free_on_device() -> int | None:
            for gpu in self.gpus.read():
                if f"gpu{gpu.index}" == resident.device and not gpu.simulated:
                    return gpu.free
            return None  # host RAM is back when the process is reaped; simulated GPUs too

        recovered, waited = await await_free(free_on_device, resident.footprint.total)
        if not recovered:
            log.warning("%s: %s memory not back after %.1f s; loading anyway",
                        resident.artifact.name, resident.device, waited)  # fmt: skip

    async def engine_hung(self, resident: Resident, idle: float) -> None:
        """A ready engine that stopped answering mid-call: stop it (the ladder ends in SIGKILL
        for the group), drop it so the next call loads it again, count it as a crash."""
        if self._residents.get(resident.key) is not resident:
            return  # another call already found it hung
        log.error("%s hung: nothing for %.0f s and no answer to /health; restarting it",
                  resident.artifact.name, idle)  # fmt: skip
        tail = resident.child.tail() if resident.child else []
        await self._stop(resident, "hung")
        self._crashed(resident, f"hung mid-call (nothing for {idle:.0f} s)", tail)

    def _crashed(self, resident: Resident, reason: str, tail: list[str]) -> None:
        failed = self.crashes.crashed(resident.key, reason, tail, time.time())
        if failed is not None:
            log.error("%s marked failed after %d crashes; calls get engine_failed until an "
                      "operator clears it", resident.artifact.name, failed.crashes)  # fmt: skip

    async def _stop(
        self, resident: Resident, reason: str | None = None, for_model: str | None = None,
        call_id: int | None = None,
    ) -> None:  # fmt: skip
        """Stop a resident; with a ``reason`` it is an eviction, recorded as one."""
        if reason is not None and self.store is not None:
            self.store.evicted(resident.artifact.name, str(resident.artifact.path),
                               resident.holdings(), reason, for_model, call_id,
                               time.monotonic() - resident.last_used)  # fmt: skip
        resident.state = ResidentState.STOPPING
        if resident.child is not None:
            await resident.child.stop(self.config.stop_grace)
            self._child_ended(resident, "stopped")
        if self._residents.get(resident.key) is resident:
            del self._residents[resident.key]
        if not resident.ready.done():  # stopped while loading: wake whoever waits for it
            resident.ready.set_exception(
                ShuttingDown(f"'{resident.artifact.name}' was stopped while it loaded")
            )
        self._notify()

    def _log_path(self, resident: Resident, port: int) -> Path:
        safe = re.sub(r"[^A-Za-z0-9._-]+", "_", resident.artifact.name)
        return self.config.log_dir / f"{safe}-{port}.log"

    def start(self) -> None:
        """Background work: preload and pinned models, and the idle-TTL unloader."""
        from .sensors import sense
        from .warmth import unload_idle, warm_up

        self._spawn(warm_up(self))
        self._spawn(unload_idle(self))
        self._spawn(sense(self))

    async def close(self) -> None:
        """Stop every child, each bounded by the stop ladder."""
        self._closing = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(
            *(self._stop(r) for r in list(self._residents.values())), return_exceptions=True
        )

    def kill_all_now(self) -> None:
        for resident in self._residents.values():
            if resident.child is not None:
                resident.child.kill_now()


def _summed(parts: Iterable[Footprint]) -> Footprint:
    weights = kv = compute = output = 0
    for f in parts:
        weights, kv, compute, output = (weights + f.weights, kv + f.kv, compute + f.compute,
                                        output + f.output)  # fmt: skip
    return Footprint(weights, kv, compute, output)
