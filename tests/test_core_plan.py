"""The placement core, proven on generated snapshots: no I/O, no clocks, no processes."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from fitbox.core.plan import decide
from fitbox.core.types import (
    Ask,
    Device,
    DeviceKind,
    Footprint,
    Place,
    Refuse,
    RefuseReason,
    ResidentState,
    ResidentView,
    Snapshot,
    Wait,
)

GiB = 1 << 30


def fp(total: int) -> Footprint:
    return Footprint(weights=total, kv=0, compute=0, output=0)


def resident(
    key: str,
    size: int,
    *,
    calls: int = 0,
    last_used: float = 0.0,
    state: ResidentState = ResidentState.READY,
    device: str = "host",
    pinned: bool = False,
) -> ResidentView:
    return ResidentView(key, device, size, state, calls, last_used, pinned)


HOST = Device("host", DeviceKind.HOST, 10 * GiB)


def test_fits_without_eviction() -> None:
    snap = Snapshot((HOST,), (resident("a", 4 * GiB),))
    assert decide(snap, Ask("b", fp(5 * GiB))) == Place("host", ())


def test_evicts_least_recently_used_first() -> None:
    snap = Snapshot(
        (HOST,),
        (
            resident("old", 4 * GiB, last_used=1.0),
            resident("new", 4 * GiB, last_used=2.0),
        ),
    )
    decision = decide(snap, Ask("c", fp(5 * GiB)))
    assert isinstance(decision, Place)
    assert [v.key for v in decision.victims] == ["old"]


def test_never_evicts_a_resident_with_calls() -> None:
    snap = Snapshot((HOST,), (resident("busy", 8 * GiB, calls=1),))
    decision = decide(snap, Ask("b", fp(5 * GiB)))
    assert isinstance(decision, Wait)
    assert decision.blockers == ("busy",)


def test_never_evicts_a_loading_resident() -> None:
    snap = Snapshot((HOST,), (resident("loading", 8 * GiB, state=ResidentState.STARTING),))
    assert isinstance(decide(snap, Ask("b", fp(5 * GiB))), Wait)


def test_refuses_what_an_empty_box_cannot_hold_with_the_numbers() -> None:
    snap = Snapshot((HOST,), (resident("a", 1 * GiB),))
    decision = decide(snap, Ask("huge", fp(11 * GiB)))
    assert decision == Refuse(RefuseReason.LARGER_THAN_BOX, needed=11 * GiB, available=10 * GiB)


def test_prefers_a_gpu_then_the_host() -> None:
    gpu = Device("gpu0", DeviceKind.GPU, 24 * GiB, simulated=True)
    assert decide(Snapshot((HOST, gpu), ()), Ask("m", fp(GiB))) == Place("gpu0", ())
    full = resident("big", 24 * GiB, calls=1, device="gpu0")
    assert decide(Snapshot((HOST, gpu), (full,)), Ask("m", fp(GiB))) == Place("host", ())


def test_evicts_where_the_fewest_bytes_leave() -> None:
    gpu0 = Device("gpu0", DeviceKind.GPU, 10 * GiB)
    gpu1 = Device("gpu1", DeviceKind.GPU, 10 * GiB)
    snap = Snapshot(
        (gpu0, gpu1),
        (
            resident("a", 8 * GiB, device="gpu0", last_used=0.0),
            resident("b", 5 * GiB, device="gpu1", last_used=5.0),
        ),
    )
    decision = decide(snap, Ask("m", fp(6 * GiB)))
    assert isinstance(decision, Place)
    assert decision.device == "gpu1" and [v.key for v in decision.victims] == ["b"]


residents_strategy = st.lists(
    st.builds(
        resident,
        key=st.text("abcdefgh", min_size=1, max_size=3),
        size=st.integers(1, 12 * GiB),
        calls=st.integers(0, 2),
        last_used=st.floats(0, 100),
        state=st.sampled_from(list(ResidentState)),
        pinned=st.booleans(),
    ),
    max_size=8,
    unique_by=lambda r: r.key,
)


@given(
    residents=residents_strategy, need=st.integers(1, 16 * GiB), capacity=st.integers(1, 16 * GiB)
)
def test_invariants(residents: list[ResidentView], need: int, capacity: int) -> None:
    host = Device("host", DeviceKind.HOST, capacity)
    snap = Snapshot((host,), tuple(residents))
    decision = decide(snap, Ask("new", fp(need)))
    by_key = {r.key: r for r in residents}
    if isinstance(decision, Refuse) and decision.reason is RefuseReason.LARGER_THAN_BOX:
        assert need > capacity
    elif isinstance(decision, Refuse):  # held by pinned residents alone: waiting cannot help
        assert decision.holders and all(by_key[k].pinned for k in decision.holders)
        unpinned = tuple(dataclasses.replace(r, pinned=False) for r in residents)
        relaxed = decide(Snapshot((host,), unpinned), Ask("new", fp(need)))
        assert not isinstance(relaxed, Refuse)  # the pins are what really binds
    elif isinstance(decision, Place):
        for victim in decision.victims:  # only idle, ready, unpinned residents ever leave
            assert by_key[victim.key].calls == 0 and not by_key[victim.key].pinned
            assert by_key[victim.key].state is ResidentState.READY
        leaving = {v.key for v in decision.victims}
        staying = sum(r.bytes for r in residents if r.key not in leaving)
        assert staying + need <= capacity  # the plan fits
        # and it evicts no more than it must: without its last victim it would not fit
        if decision.victims:
            last = decision.victims[-1]
            assert staying + last.bytes + need > capacity
    else:
        assert need <= capacity
        idle = sum(
            r.bytes for r in residents
            if r.calls == 0 and r.state is ResidentState.READY and not r.pinned
        )  # fmt: skip
        assert any(not r.pinned and r.key in decision.blockers for r in residents)
        held = sum(r.bytes for r in residents)
        assert held - idle + need > capacity  # evicting every idle one would not be enough
    assert decide(snap, Ask("new", fp(need))) == decision  # same input, same output


def test_a_pinned_resident_is_never_a_victim() -> None:
    pinned = ResidentView("keep", "host", 8 * GiB, ResidentState.READY, 0, 0.0, pinned=True)
    decision = decide(Snapshot((HOST,), (pinned,)), Ask("b", fp(5 * GiB)))
    assert decision == Refuse(RefuseReason.HELD_BY_PINNED, needed=5 * GiB, available=2 * GiB,
                              holders=("keep",))  # waiting would never help  # fmt: skip
    busy = resident("busy", 1 * GiB, calls=1)
    assert isinstance(decide(Snapshot((HOST,), (pinned, busy)), Ask("b", fp(2 * GiB))), Wait)
