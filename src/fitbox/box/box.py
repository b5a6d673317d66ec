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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fitbox.config import Config
from fitbox.core import plan, sizing
from fitbox.core.types import (
    Ask,
    Device,
    DeviceKind,
    Footprint,
    Place,
    Refuse,
    RefuseReason,
    ResidentState,
    Snapshot,
)
from fitbox.engines.child import Child, ChildExited, ChildTimeout, free_port
from fitbox.engines.http1 import EnginePool
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
    DoesNotFit,
    EngineFailed,
    InvalidRequest,
    ModelBusy,
    ShuttingDown,
)
from fitbox.models.catalog import Artifact, Catalog
from fitbox.probe.gpus import GpuProbe
from fitbox.probe.host import read_host
from fitbox.store.db import MeasuredFootprint, Store
from fitbox.units import format_bytes

from .crashes import CrashLedger
from .pricing import Contract, MeasuredKey, footprint_row, measurement, price
from .recovery import await_free
from .resident import Resident

log = logging.getLogger(__name__)
ALL_LAYERS = 999


@dataclass
class Lease:
    """A call's hold on a ready resident. ``release()`` once the call is done."""

    resident: Resident
    box: Box
    evicted: list[str] = field(default_factory=list)
    loaded: bool = False
    _released: bool = False

    @property
    def engine(self) -> EnginePool:
        assert self.resident.child is not None
        return self.resident.child.pool

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.box._release(self.resident)


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
        self._waiting: dict[object, dict[str, Any]] = {}  # calls waiting for room, for /v1/queue
        self.crashes = CrashLedger(config.crash_limit, config.crash_window, config.crash_backoff)

    def queue(self) -> list[dict[str, Any]]:
        """Calls waiting for room, oldest first (FIFO: the admission queue is issue #4's)."""
        return sorted((dict(w) for w in self._waiting.values()), key=lambda w: w["since"])

    # -- reading -----------------------------------------------------------------

    def residents(self) -> list[Resident]:
        return list(self._residents.values())

    def is_resident(self, artifact: Artifact) -> bool:
        return artifact.key in self._residents

    def devices(self) -> list[Device]:
        """What each pool can hold now: live free memory plus what our own residents hold."""
        held: dict[str, int] = {}
        for r in self._residents.values():
            held[r.device] = held.get(r.device, 0) + r.footprint.total
        devices = []
        for gpu in self.gpus.read():
            device_id = f"gpu{gpu.index}"
            capacity = (
                gpu.total if gpu.simulated else min(gpu.total, gpu.free + held.get(device_id, 0))
            )
            devices.append(Device(device_id, DeviceKind.GPU, capacity, gpu.simulated))
        # Weights are mmap'd: their pages sit in the page cache, which MemAvailable already
        # counts as available. Only the anonymous parts (KV, compute, output) are added back.
        anonymous = sum(
            r.footprint.total - r.footprint.weights
            for r in self._residents.values()
            if r.device == "host"
        )
        host = read_host()
        capacity = min(host.mem_available + anonymous, host.mem_total)
        if self.config.ram_max is not None:
            capacity = min(capacity, self.config.ram_max)
        devices.append(Device("host", DeviceKind.HOST, capacity))
        return devices

    def snapshot(self, devices: list[Device] | None = None) -> Snapshot:
        return Snapshot(
            devices=tuple(self.devices() if devices is None else devices),
            residents=tuple(r.view() for r in self._residents.values()),
        )

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
        await self._stop(resident)
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

    def contract_for(self, artifact: Artifact) -> Contract:
        window = sizing.effective_window(artifact.facts.shape, self.config.ctx)
        return Contract(window=window, parallel=self.config.parallel)

    def price(
        self, artifact: Artifact, contract: Contract, devices: list[Device] | None = None
    ) -> tuple[Ask, dict[str, str]]:
        return price(
            artifact, contract, self.devices() if devices is None else devices, self._measured
        )

    def plan_for(
        self,
        name: str,
        ctx: int | None = None,
        parallel: int | None = None,
        kv: str = "f16",
    ) -> dict[str, Any]:
        """What the box would do for ``name`` now, without doing it (``fitbox plan``)."""
        artifact = self.catalog.resolve(name)
        shape = artifact.facts.shape
        contract = Contract(
            window=sizing.effective_window(shape, ctx or self.config.ctx),
            parallel=parallel or self.config.parallel, type_k=kv, type_v=kv,
        )  # fmt: skip
        problem = sizing.kv_type_problem(shape, kv, kv, flash_attn=True)
        if problem:
            raise InvalidRequest(
                f"'{artifact.name}' cannot use a {kv} cache: {problem}", param="kv"
            )
        devices = self.devices()
        ask, basis = self.price(artifact, contract, devices)
        snapshot = self.snapshot(devices)
        decision = plan.decide(snapshot, ask)
        names = {r.key: r.artifact.name for r in self._residents.values()}
        if isinstance(decision, Place):
            device, outcome = decision.device, "place"
            extra: dict[str, Any] = {"victims": [names.get(v.key, v.key) for v in decision.victims]}
        elif isinstance(decision, Refuse):
            device = max(snapshot.devices, key=lambda d: d.capacity).id
            outcome = "refuse"
            extra = {
                "reason": decision.reason.value,
                "needed_bytes": decision.needed,
                "available_bytes": decision.available,
            }
        else:
            device = next(d.id for d in snapshot.devices)
            outcome = "wait"
            extra = {
                "reason": decision.reason.value,
                "blockers": [names.get(k, k) for k in decision.blockers],
            }
        held = {d.id: 0 for d in snapshot.devices}
        for r in snapshot.residents:
            held[r.device] = held.get(r.device, 0) + r.bytes
        return {
            "model": artifact.name, "artifact": str(artifact.path),
            "architecture": artifact.facts.architecture, "quant": artifact.facts.quant,
            "window": contract.window, "parallel": contract.parallel,
            "type_k": contract.type_k, "type_v": contract.type_v,
            "decision": outcome, "device": device, "basis": basis.get(device, "estimate"),
            "devices": [footprint_row(device, ask.footprint_on(device))],
            "box": [{"device": d.id, "capacity_bytes": d.capacity,
                     "free_bytes": d.capacity - held.get(d.id, 0), "simulated": d.simulated}
                    for d in snapshot.devices],
            **extra,
        }  # fmt: skip

    async def acquire(self, name: str, call_id: int | None = None) -> Lease:
        """Find or load the model ``name`` and hold it for one call."""
        if self._closing:
            raise ShuttingDown("fitbox is shutting down; retry against the restarted service")
        artifact = self.catalog.resolve(name)
        self._refuse_if_failed(artifact)
        deadline = time.monotonic() + self.config.wait_timeout
        if artifact.key not in self._residents:  # crash-loop backoff before a restart
            delay = self.crashes.wait_before_restart(artifact.key, time.time())
            if delay > 0:
                await asyncio.sleep(min(delay, self.config.wait_timeout))
                self._refuse_if_failed(artifact)
        lease: Lease | None = None
        ticket = object()
        try:
            while lease is None:
                async with self._lock:
                    lease, blockers = self._decide(artifact, call_id)
                    changed = self._changed
                if lease is None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise ModelBusy(
                            f"'{name}' needs room held by models serving calls "
                            f"({', '.join(blockers)}); they did not finish within "
                            f"{self.config.wait_timeout:.0f} s",
                            blockers=blockers,
                        )
                    self._waiting.setdefault(ticket, {
                        "model": artifact.name, "call_id": call_id, "since": time.time(),
                        "deadline": time.time() + remaining})  # fmt: skip
                    self._waiting[ticket]["blocked_by"] = blockers
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(changed.wait(), timeout=remaining)
        finally:
            self._waiting.pop(ticket, None)
        try:
            await asyncio.wait_for(
                asyncio.shield(lease.resident.ready), timeout=self.config.load_timeout + 30
            )
        except BaseException:
            lease.release()
            raise
        return lease

    def _decide(self, artifact: Artifact, call_id: int | None) -> tuple[Lease | None, list[str]]:
        """Under the lock: join a resident, place a new one, or say who blocks."""
        existing = self._residents.get(artifact.key)
        if existing is not None:
            if existing.state is ResidentState.STOPPING:
                return None, [artifact.name]
            existing.calls += 1
            existing.last_used = time.monotonic()
            return Lease(existing, self), []

        contract = self.contract_for(artifact)
        window = contract.window
        devices = self.devices()  # one probe reading serves pricing, deciding and labelling
        ask, basis = self.price(artifact, contract, devices)
        decision = plan.decide(self.snapshot(devices), ask)
        if isinstance(decision, Refuse) and decision.reason is RefuseReason.HELD_BY_PINNED:
            pinned = [self._residents[k].artifact.name for k in decision.holders
                      if k in self._residents]  # fmt: skip
            raise DoesNotFit(
                f"'{artifact.name}' needs {format_bytes(decision.needed)}; the room is held by "
                f"pinned models ({', '.join(pinned)}): unpin one to make room",
                param="model", code="held_by_pinned", needed_bytes=decision.needed,
                available_bytes=decision.available, pinned=pinned,
            )  # fmt: skip
        if isinstance(decision, Refuse):
            raise DoesNotFit(
                f"'{artifact.name}' needs {format_bytes(decision.needed)} at a {window}-token "
                f"window, but the largest place on this box holds "
                f"{format_bytes(decision.available)} (raise --ram-max, or use a smaller "
                f"quant or window)",
                param="model",
                needed_bytes=decision.needed,
                available_bytes=decision.available,
            )
        if not isinstance(decision, Place):
            names = [
                self._residents[k].artifact.name for k in decision.blockers if k in self._residents
            ]
            return None, names

        victims = [self._residents[v.key] for v in decision.victims]
        for victim in victims:
            victim.state = ResidentState.STOPPING
        device = next(d for d in devices if d.id == decision.device)
        resident = Resident(
            artifact=artifact,
            device=decision.device,
            footprint=ask.footprint_on(decision.device),
            window=window,
            parallel=self.config.parallel,
            simulated=device.simulated,
            calls=1,
            basis=basis.get(decision.device, "estimate"),
            loaded_by_call=call_id,
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
                await self._stop(victim)
            if victims:
                await self._memory_back(resident)
            engine = self.engine()
            port = free_port()
            intent = LaunchIntent(
                model_path=resident.artifact.path,
                alias=resident.artifact.name,
                window=resident.window,
                parallel=resident.parallel,
                embedding=resident.artifact.facts.is_embedding,
                gpu_layers=0 if resident.device == "host" else ALL_LAYERS,
                port=port,
            )
            child = Child(build_argv(engine, intent), port, self._log_path(resident, port))
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
        contract = Contract(window=resident.window, parallel=resident.parallel)
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
        if not isinstance(exc, EngineNotFound | EngineFailed):  # the engine, not the model
            self._crashed(resident, error.message, error.detail.get("log_tail", []))
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

    def _crashed(self, resident: Resident, reason: str, tail: list[str]) -> None:
        failed = self.crashes.crashed(resident.key, reason, tail, time.time())
        if failed is not None:
            log.error("%s marked failed after %d crashes; calls get engine_failed until an "
                      "operator clears it", resident.artifact.name, failed.crashes)  # fmt: skip

    async def _stop(self, resident: Resident) -> None:
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
