"""The placement core's invariants, over generated snapshots and asks (hypothesis)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from fitbox.core import claims
from fitbox.core.ask import Ask, Candidate
from fitbox.core.decide import decide
from fitbox.core.decision import Place, Refuse, RefuseReason, Wait
from fitbox.core.types import Device, DeviceKind, Goal, ResidentState, ResidentView, Rung, Snapshot
from tests.support.core_builders import GiB, fixed, gpu, host, model

CORES = tuple(range(6))


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    n_gpus = draw(st.integers(0, 3))
    devices: list[Device] = [gpu(i, draw(st.integers(1, 24)) * GiB // 2) for i in range(n_gpus)]
    devices.append(host(draw(st.integers(1, 64)) * GiB // 2))
    free_cores = list(CORES)
    residents = []
    for i in range(draw(st.integers(0, 6))):
        device = draw(st.sampled_from([d.id for d in devices]))
        n_cores = draw(st.integers(0, 2))
        cores, free_cores = tuple(free_cores[:n_cores]), free_cores[n_cores:]
        residents.append(
            ResidentView(
                key=f"r{i}",
                device=device,
                bytes=draw(st.integers(1, 16)) * GiB // 4,
                state=draw(st.sampled_from(list(ResidentState))),
                calls=draw(st.integers(0, 2)),
                last_used=draw(st.floats(0, 100)),
                pinned=draw(st.booleans()),
                cores=cores,
                band=draw(st.integers(1, 3)),
                reload_seconds=draw(st.none() | st.floats(0.1, 60)),
                eta_idle=draw(st.none() | st.floats(0, 200)),
            )
        )
    busy = tuple(draw(st.lists(st.sampled_from(CORES), max_size=2, unique=True)))
    return Snapshot(tuple(devices), tuple(residents), cores=CORES, busy_cores=busy)


@st.composite
def asks(draw: st.DrawFn) -> Ask:
    candidates: list[Candidate] = []
    for i in range(draw(st.integers(1, 3))):
        size = draw(st.integers(1, 40)) * GiB // 4
        if draw(st.booleans()):
            trained = draw(st.sampled_from([2048, 8192, 131072]))
            candidates.append(
                model(
                    f"m{i}",
                    size,
                    n_layer=draw(st.integers(1, 40)),
                    moe=draw(st.booleans()),
                    four_bit=draw(st.booleans()),
                    n_ctx_train=trained,
                )
            )
        else:
            candidates.append(fixed(f"m{i}", size, four_bit=draw(st.booleans())))
    return Ask(
        "m",
        tuple(candidates),
        need=draw(st.integers(1, 20000)),
        window=draw(st.sampled_from([512, 4096, 16384])),
        goal=draw(st.sampled_from(list(Goal))),
        max_wait=draw(st.floats(0, 300)),
        cpu_floor=draw(st.integers(1, 3)),
        kv_types=draw(st.sampled_from([(("f16", "f16"),), (("f16", "f16"), ("q8_0", "q8_0"))])),
    )


def _held(snapshot: Snapshot, device: str, leaving: set[str]) -> int:
    reserved = sum(r.bytes for r in snapshot.reservations if r.device == device)
    return reserved + sum(r.bytes_on(device) for r in snapshot.residents if r.key not in leaving)


@settings(max_examples=300)
@given(snapshot=snapshots(), ask=asks())
def test_invariants(snapshot: Snapshot, ask: Ask) -> None:
    decision = decide(snapshot, ask)
    assert decide(snapshot, ask) == decision  # same input, same decision
    by_key = {r.key: r for r in snapshot.residents}
    if isinstance(decision, Place):
        leaving = {v.key for v in decision.victims}
        for victim in decision.victims:  # never a serving, loading or pinned resident
            assert by_key[victim.key].evictable
        for device in snapshot.devices:  # never above any device's tier
            if decision.bytes_on(device.id):
                assert _held(snapshot, device.id, leaving) + decision.bytes_on(device.id) <= (
                    device.capacity
                )
        assert all(d in {x.id for x in snapshot.devices} for d, _ in decision.footprint)
        if all(
            _held(snapshot, d, set()) + f.total <= snapshot.device(d).capacity  # type: ignore[union-attr]
            for d, f in decision.footprint
        ):
            assert decision.victims == ()  # it fits as is: nothing leaves
        # claims never overlap: the OS core only lent to an engine alone, cores busy with
        # other work only once every other claimable one is taken, never a working engine's
        keep = claims.reserved_core(snapshot.cores)
        alone = not any(r.cores for r in snapshot.residents if r.key not in leaving)
        if keep in decision.cores:
            assert alone and keep not in snapshot.busy_cores
        if set(decision.cores) & set(snapshot.busy_cores):
            free, idle = claims.claimable(
                snapshot.cores, snapshot.busy_cores, snapshot.residents, leaving
            )
            assert set(free) | {c for c, _ in idle} <= set(decision.cores)
        for r in snapshot.residents:
            if r.key not in leaving and r.key not in decision.cores_from:
                assert not set(r.cores) & set(decision.cores)
            if r.key in decision.cores_from:
                assert r.idle
        assert decision.cores  # every engine gets at least one core
    elif isinstance(decision, Wait):
        assert decision.blockers
        assert all(by_key[k].settles for k in decision.blockers)  # never waits on a pin
    else:
        _relaxing_the_constraint_helps(snapshot, ask, decision)


def _relaxing_the_constraint_helps(snapshot: Snapshot, ask: Ask, refusal: Refuse) -> None:
    if refusal.reason is RefuseReason.LARGER_THAN_BOX:
        bigger = tuple(replace(d, capacity=d.capacity * 1000) for d in snapshot.devices)
        relaxed = decide(replace(snapshot, devices=bigger, cores=()), ask)
        assert isinstance(relaxed, Place)
    elif refusal.reason is RefuseReason.HELD_BY_PINNED:
        assert refusal.holders
        unpinned = tuple(replace(r, pinned=False) for r in snapshot.residents)
        relaxed = decide(replace(snapshot, residents=unpinned, cores=()), ask)
        assert isinstance(relaxed, Place | Wait)
    elif refusal.reason is RefuseReason.NO_CORES:
        relaxed = decide(replace(snapshot, cores=(), busy_cores=()), ask)
        assert isinstance(relaxed, Place | Wait)
    elif refusal.reason is RefuseReason.CONTEXT:
        relaxed = decide(snapshot, replace(ask, need=1))
        assert not (isinstance(relaxed, Refuse) and relaxed.reason is RefuseReason.CONTEXT)
    else:
        assert refusal.reason in (RefuseReason.NO_CANDIDATE, RefuseReason.BAD_ARTIFACT)


@given(snapshot=snapshots(), ask=asks(), busy=st.lists(st.sampled_from(CORES), unique=True))
def test_cores_busy_with_other_work_never_refuse_and_only_shrink_a_claim(
    snapshot: Snapshot, ask: Ask, busy: list[int]
) -> None:
    """Other work on any cores never turns a placement or a wait into a refusal; a claim
    that takes a busy core takes just that one, and only when no other is left."""
    quiet = decide(replace(snapshot, busy_cores=()), ask)
    loaded = replace(snapshot, busy_cores=tuple(busy))
    decision = decide(loaded, ask)
    if not isinstance(quiet, Refuse):
        assert not isinstance(decision, Refuse) or decision.reason is not RefuseReason.NO_CORES
    if isinstance(decision, Place) and set(decision.cores) & set(busy):
        assert len(decision.cores) == 1


@given(snapshot=snapshots(), ask=asks())
def test_without_residents_nothing_is_evicted_and_waiting_never_happens(
    snapshot: Snapshot, ask: Ask
) -> None:
    empty = replace(snapshot, residents=())
    decision = decide(empty, ask)
    assert not isinstance(decision, Wait)
    if isinstance(decision, Place):
        assert decision.victims == ()


@st.composite
def gpu_asks(draw: st.DrawFn) -> Ask:
    """One variant on the GPU rung alone: the rung within which the window comes first."""
    size = draw(st.integers(1, 40)) * GiB // 4
    candidate = model(
        "m",
        size,
        n_layer=draw(st.integers(1, 40)),
        moe=draw(st.booleans()),
        n_ctx_train=draw(st.sampled_from([2048, 8192, 131072])),
    )
    return Ask(
        "m",
        (candidate,),
        need=draw(st.integers(1, 20000)),
        rungs=(Rung.GPU_ONLY,),
        window=draw(st.sampled_from([512, 4096, 16384])),
        parallel=draw(st.sampled_from([1, 2])),
        max_wait=draw(st.floats(0, 300)),
        kv_types=draw(st.sampled_from([(("f16", "f16"),), (("f16", "f16"), ("q8_0", "q8_0"))])),
    )


@settings(max_examples=300)
@given(snapshot=snapshots(), ask=gpu_asks(), size=st.integers(1, 24), at=st.integers(0, 3))
def test_adding_a_gpu_never_shrinks_the_window_nor_adds_a_victim(
    snapshot: Snapshot, ask: Ask, size: int, at: int
) -> None:
    """A new, empty GPU anywhere in the engine's order: the window can only grow, and at the
    same window nobody new has to leave."""
    gpus = [d for d in snapshot.devices if d.kind is DeviceKind.GPU]
    others = [d for d in snapshot.devices if d.kind is not DeviceKind.GPU]
    gpus.insert(min(at, len(gpus)), Device("gpu-new", DeviceKind.GPU, size * GiB // 2, True))
    grown = replace(snapshot, devices=(*gpus, *others))
    before, after = decide(snapshot, ask), decide(grown, ask)
    if isinstance(before, Place):
        assert isinstance(after, Place), after
        assert after.window >= before.window
        if after.window == before.window:
            assert {v.key for v in after.victims} <= {v.key for v in before.victims}
