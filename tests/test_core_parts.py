"""The core's parts: admission order, CPU claims, tiers, pins, eviction and the fast sizer."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fitbox.core import claims, evict, pins, tiers
from fitbox.core.admission import Policy, Ticket, order
from fitbox.core.ask import Candidate
from fitbox.core.costs import Sizer
from fitbox.core.repack import CpuFeatures, host_weights
from fitbox.core.room import Room
from fitbox.core.sizing import ModelShape
from fitbox.core.split import Layout, Placement, footprint_by_device, layer_devices, layer_ranges
from fitbox.core.splits import Splits
from fitbox.core.types import RUNG_ORDER, ResidentState, Rung, Snapshot
from fitbox.models.gguf_facts import read_facts
from tests.support import gguf_zoo
from tests.support.core_builders import GiB, gpu, host, resident

# -- admission -------------------------------------------------------------------------------


def ids(tickets: list[Ticket]) -> list[int]:
    return [t.id for t in tickets]


def test_admission_eta_shortest_first_and_unmeasured_keep_their_slot() -> None:
    tickets = [
        Ticket(1, "big", 1, ready_in=0, load=30, output=60),
        Ticket(2, "new", 2),  # no history: stays second
        Ticket(3, "small", 3, ready_in=0, load=0, output=2),
    ]
    assert ids(order(tickets)) == [3, 2, 1]


def test_admission_eta_never_reorders_a_group() -> None:
    tickets = [
        Ticket(1, "a", 1, group="s", ready_in=0, load=0, output=50),
        Ticket(2, "b", 2, ready_in=0, load=0, output=10),
        Ticket(3, "a", 3, group="s", ready_in=0, load=0, output=1),
    ]
    ordered = ids(order(tickets))
    assert ordered.index(1) < ordered.index(3)


def test_admission_background_after_every_foreground() -> None:
    tickets = [
        Ticket(1, "warm", 1, background=True, ready_in=0, load=0, output=0.1),
        Ticket(2, "chat", 2, ready_in=0, load=30, output=60),
    ]
    assert ids(order(tickets)) == [2, 1]


def test_admission_promotes_a_ticket_whose_max_wait_has_or_would_pass() -> None:
    tickets = [
        Ticket(1, "a", 1, ready_in=0, load=0, output=1),
        Ticket(2, "b", 2, waited=119, max_wait=120, ready_in=0, load=0, output=5),
        Ticket(3, "c", 3, waited=121, max_wait=120),
    ]
    assert ids(order(tickets)) == [2, 3, 1]


def test_admission_smart_batches_by_model_fifo_is_arrival() -> None:
    tickets = [Ticket(i, m, i) for i, m in enumerate(["a", "b", "a", "b", "c", "a"])]
    assert [t.model for t in order(tickets, Policy.SMART)] == ["a", "a", "a", "b", "b", "c"]
    assert ids(order(tickets, Policy.FIFO)) == [0, 1, 2, 3, 4, 5]


tickets_strategy = st.lists(
    st.builds(
        Ticket,
        id=st.integers(0, 10**6),
        model=st.sampled_from("abc"),
        arrived=st.integers(0, 50),
        waited=st.floats(0, 200),
        group=st.none() | st.sampled_from(["g", "h"]),
        background=st.booleans(),
        ready_in=st.none() | st.floats(0, 60),
        load=st.none() | st.floats(0, 60),
        output=st.none() | st.floats(0, 60),
    ),
    unique_by=lambda t: t.id,
    max_size=12,
)


@given(tickets=tickets_strategy, policy=st.sampled_from(list(Policy)))
def test_admission_is_a_permutation_that_keeps_groups_and_puts_background_last(
    tickets: list[Ticket], policy: Policy
) -> None:
    ordered = order(tickets, policy)
    assert sorted(ids(ordered)) == sorted(ids(tickets))
    kinds = [t.background for t in ordered]
    assert kinds == sorted(kinds)
    for group in ("g", "h"):
        for background in (False, True):
            members = [
                t
                for t in ordered
                if t.group == group
                and t.background == background
                and not (policy is Policy.ETA and t.overdue)
            ]
            assert members == sorted(members, key=lambda t: (t.arrived, t.id))


# -- claims ----------------------------------------------------------------------------------


def test_claims_one_core_for_a_gpu_engine_and_one_kept_for_the_os() -> None:
    assert claims.claim(range(4), (), [], (), weights_in_ram=False, floor=1) == claims.Claim((1,))


def test_claims_ram_engine_takes_every_free_core_without_a_curve() -> None:
    busy = resident("b", GiB, calls=1, cores=(1,))
    got = claims.claim(range(6), (5,), [busy], (), weights_in_ram=True, floor=2)
    assert got == claims.Claim((2, 3, 4))


def test_claims_ram_engine_stops_where_more_threads_stop_helping() -> None:
    curve = ((1, 5.0), (2, 9.0), (3, 11.5), (4, 11.8), (8, 11.9))
    got = claims.claim(range(8), (), [], (), weights_in_ram=True, floor=1, threads=curve)
    assert got is not None and len(got.cores) == 4  # 11.8 is within 1 % of 11.9; 11.5 is not


def test_claims_a_curve_that_never_saw_this_many_cores_takes_them_all() -> None:
    # measured only at one core (it shared the box then): alone now, it gets both
    got = claims.claim(range(2), (), [], (), weights_in_ram=True, floor=1, threads=((1, 50.0),))
    assert got == claims.Claim((0, 1))


def test_claims_idle_cores_can_be_taken_busy_never() -> None:
    idle = resident("idle", GiB, cores=(1, 2))
    busy = resident("busy", GiB, calls=1, cores=(3,))
    got = claims.claim(range(4), (), [idle, busy], (), weights_in_ram=True, floor=2)
    assert got == claims.Claim((1, 2), ("idle",))
    assert claims.claim(range(4), (), [busy], (), weights_in_ram=True, floor=3) is None


def test_claims_an_engine_alone_borrows_the_reserved_core_as_llama_server_would() -> None:
    # a 2-core box: llama-server started by hand runs 2 threads; alone, fitbox's engine too
    assert claims.claim(range(2), (), [], (), weights_in_ram=True, floor=1) == claims.Claim((0, 1))
    # a many-core box (FITBOX_CPU_MAX / the inventory): every core, as its default would
    many = claims.claim(range(16), (), [], (), weights_in_ram=True, floor=1)
    assert many is not None and many.cores == tuple(range(16))
    # a curve that stops helping leaves the OS its core: the lent one is picked last
    curve = ((1, 5.0), (2, 9.0), (4, 9.0))
    assert claims.claim(
        range(4), (), [], (), weights_in_ram=True, floor=1, threads=curve
    ) == claims.Claim((1, 2))
    # a cores tier an operator set (--cpu-max) stands: nothing is lent on top of it
    assert claims.claim(
        range(2), (), [], (), weights_in_ram=True, floor=1, lend=False
    ) == claims.Claim((1,))
    # a GPU-only engine does not borrow it
    assert claims.claim(range(2), (), [], (), weights_in_ram=False, floor=1) == claims.Claim((1,))


def test_claims_never_lend_the_reserved_core_beside_another_engine() -> None:
    idle = resident("idle", GiB, cores=(0, 1))  # it borrowed core 0 when it was alone
    got = claims.claim(range(2), (), [idle], (), weights_in_ram=True, floor=1)
    assert got == claims.Claim((1,), ("idle",))  # core 0 stays with the first engine and the OS
    gpu = resident("gpu", GiB, calls=1, cores=(3,))
    got = claims.claim(range(4), (), [gpu], (), weights_in_ram=True, floor=1)
    assert got == claims.Claim((1, 2))
    # a leaving victim holds nothing: the newcomer is alone again
    got = claims.claim(range(2), (), [idle], ("idle",), weights_in_ram=True, floor=1)
    assert got == claims.Claim((0, 1))


def test_claims_cores_busy_with_other_work_are_taken_last() -> None:
    # free cores first; a claim short of its floor because other work keeps cores busy
    # shrinks to the cores that are not (here the lent one), never crowds a busy one
    assert claims.claim(range(4), (2,), [], (), weights_in_ram=True, floor=1) == claims.Claim(
        (0, 1, 3)
    )
    assert claims.claim(range(4), (1, 2, 3), [], (), weights_in_ram=True, floor=2) == claims.Claim(
        (0,)
    )
    got = claims.claim(range(3), (2,), [], (), weights_in_ram=True, floor=2, lend=False)
    assert got == claims.Claim((1,))
    # every core busy (the reserved one too, box-wide): one thread on one busy core, the
    # issue's 2-core box (-t 2 there made a 1-token chat 290-400 ms against 30-60 at -t 1)
    assert claims.claim(range(2), (0, 1), [], (), weights_in_ram=True, floor=1) == claims.Claim(
        (1,)
    )
    assert claims.claim(range(4), (1, 2, 3), [], (), weights_in_ram=True, floor=3, lend=False) == (
        claims.Claim((1,))
    )
    # the reserved core is not lent while other work keeps it busy
    assert claims.claim(range(2), (0,), [], (), weights_in_ram=True, floor=1) == claims.Claim((1,))
    # a core busy with other work still serves a GPU engine rather than no engine at all
    assert claims.claim(range(2), (1,), [], (), weights_in_ram=False, floor=1) == claims.Claim((1,))
    busy = resident("b", GiB, calls=1, cores=(1,))
    assert claims.claim(range(2), (), [busy], (), weights_in_ram=True, floor=1) is None
    # an idle engine's core that other work keeps busy is taken last, as its other cores
    # are (it is told); a serving engine's never
    idle = resident("i", GiB, cores=(1,))
    got = claims.claim(range(3), (1, 2), [idle], (), weights_in_ram=False, floor=1)
    assert got == claims.Claim((2,))  # the busy core no engine holds comes first
    got = claims.claim(range(2), (1,), [idle], (), weights_in_ram=False, floor=1)
    assert got == claims.Claim((1,), taken_from=("i",))
    assert claims.claim(range(2), (1,), [busy], (), weights_in_ram=False, floor=1) is None


def test_claims_widen_an_idle_engine_only_onto_free_cores() -> None:
    me = resident("me", GiB, cores=(1,))  # launched on one thread beside other work
    assert claims.widened(range(2), (), [me], "me", 1, floor=1) == (0, 1)  # alone now: lent
    assert claims.widened(range(2), (0,), [me], "me", 1, floor=1) is None  # the work lasts
    assert claims.widened(range(2), (), [me], "me", 2, floor=1) is None  # it has them all
    # another engine, idle or not, keeps its cores and the reserved one is not lent beside it
    other = resident("other", GiB, cores=(3,))
    assert claims.widened(range(4), (), [me, other], "me", 1, floor=1) == (1, 2)
    beside = resident("beside", GiB, cores=(2,))
    assert claims.widened(range(3), (), [me, beside], "me", 1, floor=1) is None
    # a core busy with other work is never crowded to widen, and the curve still decides
    assert claims.widened(range(3), (2,), [me], "me", 1, floor=1) == (0, 1)  # not core 2
    assert claims.widened(range(3), (0, 2), [me], "me", 1, floor=1) is None
    curve = ((1, 100.0), (2, 99.5))  # one thread is within 1 % of two
    assert claims.widened(range(2), (), [me], "me", 1, floor=1, threads=curve) is None


def test_claims_the_reserved_core_comes_on_top_of_cpu_max() -> None:
    assert claims.claim_pool([3, 0, 2, 1], None) == (0, 1, 2, 3)
    assert claims.claim_pool(range(8), 2) == (0, 1, 2)  # core 0 stays, 1 and 2 are claimable
    assert claims.claimable_count(claims.claim_pool(range(8), 2)) == 2
    assert claims.claimable_count(range(8)) == 7
    assert claims.claimable_count([5]) == 1  # a one-core box: engines need that core


# -- tiers -----------------------------------------------------------------------------------


def test_tiers_a_setting_above_its_parent_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="box setting 200 is above what the device has"):
        tiers.check("ram", 100, 200)
    with pytest.raises(ValueError, match="central setting 90 is above the box setting"):
        tiers.check("ram", 100, 80, 90)
    tiers.check("ram", 100, 80, 70)


def test_tiers_the_least_tier_wins_and_unmanaged_use_is_charged_to_the_device() -> None:
    assert tiers.capacity(tiers.Tier("vram:gpu0", 24, 20, 16)) == 16
    assert tiers.capacity(tiers.Tier("vram:gpu0", 24, 20), unmanaged=10) == 14
    assert tiers.capacity(tiers.Tier("vram:gpu0", 24, 10), unmanaged=4) == 10


# -- pins ------------------------------------------------------------------------------------


def test_pins_from_the_name() -> None:
    assert pins.parse("qwen") == pins.Pins("qwen")
    assert pins.parse("qwen@moe") == pins.Pins("qwen", (Rung.MOE_SPLIT,))
    assert pins.parse("qwen@4bit").rungs == (Rung.FOUR_BIT,)
    assert pins.parse("qwen@max-gpu").rungs == (Rung.MAX_GPU,)
    assert pins.parse("qwen@ram").rungs == (Rung.RAM_ONLY,)
    assert pins.parse("qwen@q4_k_m") == pins.Pins("qwen", RUNG_ORDER, "Q4_K_M")
    assert pins.parse("weird@name") == pins.Pins("weird@name")


# -- eviction --------------------------------------------------------------------------------


def test_evict_nothing_when_nothing_is_short_and_none_when_it_cannot_cover() -> None:
    idle = [resident("a", GiB)]
    assert evict.choose({"host": 0}, idle) == []
    assert evict.choose({"host": 2 * GiB}, idle) is None


@given(sizes=st.lists(st.integers(1, 8), min_size=1, max_size=10), short=st.integers(1, 40))
def test_evict_the_chosen_set_covers_and_none_of_it_is_redundant(
    sizes: list[int], short: int
) -> None:
    idle = [
        resident(f"r{i}", s * GiB, reload_seconds=float(s % 3 + 1)) for i, s in enumerate(sizes)
    ]
    chosen = evict.choose({"host": short * GiB}, idle)
    if sum(sizes) < short:
        assert chosen is None
        return
    assert chosen is not None
    freed = sum(v.bytes for v in chosen)
    assert freed >= short * GiB
    assert all(freed - v.bytes < short * GiB for v in chosen)  # each one is needed


def test_evict_never_chooses_from_outside_the_pool() -> None:
    busy = resident("busy", 8 * GiB, calls=1, state=ResidentState.READY)
    assert evict.choose({"host": GiB}, [r for r in [busy] if r.evictable]) is None


# -- the fast sizer agrees with split.footprint_by_device to the byte -----------------------


ZOO = [
    gguf_zoo.write_gqa_per_layer,
    gguf_zoo.write_swa,
    gguf_zoo.write_moe,
    gguf_zoo.write_hybrid,
    gguf_zoo.write_mamba2_hybrid,
]


@pytest.mark.parametrize("write", ZOO, ids=lambda f: f.__name__)
def test_sizer_matches_split_on_the_zoo(write: object, tmp_path: Path) -> None:
    facts = read_facts(write(tmp_path / "m.gguf"))  # type: ignore[operator]
    assert facts.layout is not None
    # the same tensors typed Q4_0 (their sizes unchanged): the repack rule takes the matmuls
    as_q4 = tuple(replace(t, type="Q4_0") if t.op else t for t in facts.shape.tensors)
    shape = replace(facts.shape, tensors=as_q4)
    x86 = CpuFeatures(frozenset({"AVX2", "REPACK"}))
    assert host_weights(shape.tensors, x86).repacked
    for cpu in (None, x86):
        sizer_matches_split(Candidate("m", shape=shape, layout=facts.layout, cpu=cpu))


def sizer_matches_split(candidate: Candidate) -> None:
    shape, layout = candidate.shape, candidate.layout
    assert shape is not None and layout is not None
    n = shape.n_layer
    placements = [
        Placement(),
        Placement(("gpu0",), n + 1),
        Placement(("gpu0",), max(n // 2, 1)),
        Placement(("gpu0", "gpu1"), n + 1, (3.0, 1.0)),
        Placement(("gpu0",), n + 1, (), True),
    ]
    for parallel in (1, 3):
        for kv in ("f16", "q8_0"):
            sizer = Sizer(candidate, parallel, kv, kv)
            for placement in placements:
                for window in (512, 1000, 4096):
                    assert sizer.on(placement, window) == footprint_by_device(
                        shape,
                        layout,
                        placement,
                        window,
                        parallel,
                        type_k=kv,
                        type_v=kv,
                        cpu=candidate.cpu,
                    )


MIXED = ModelShape(
    weights_bytes=0,
    n_layer=9,
    n_ctx_train=32768,
    n_embd=256,
    n_vocab=1000,
    n_head=8,
    kv_heads=(4, 4, 2, 0, 4, 2, 4, 4, 0),
    key_length=32,
    value_length=32,
    n_swa=256,
    swa_layers=(True, False, True, False, True, False, True, False, False),
    recurrent_layers=(False, False, False, True, False, False, False, False, True),
    n_embd_r=64,
    n_embd_s=128,
    n_ff=512,
)
MIXED_LAYOUT = Layout(
    layer_bytes=(5, 7, 5, 11, 5, 7, 5, 7, 11),
    routed_bytes=(0, 3) * 4 + (3,),
    input_bytes=13,
    output_bytes=17,
    output_tied=True,
)


@given(
    gpus=st.integers(0, 4),
    ngl=st.integers(0, 12),
    shares=st.lists(st.integers(1, 40) | st.floats(0.01, 1e9), min_size=4, max_size=4),
    experts=st.booleans(),
    window=st.sampled_from([512, 1000, 4096, 20000]),
    parallel=st.integers(1, 3),
)
def test_sizer_by_layer_ranges_matches_split_layer_by_layer(
    gpus: int, ngl: int, shares: list[float], experts: bool, window: int, parallel: int
) -> None:
    """The sizer sums each device's contiguous range of layers; split walks them one by
    one. Any -ngl, any -ts (layer counts or bytes of room), layers of every kind."""
    ids = tuple(f"gpu{i}" for i in range(gpus))
    placement = Placement(ids, ngl, tuple(float(s) for s in shares[:gpus]), experts)
    ranges, output = layer_ranges(MIXED.n_layer, placement)
    layers, output_device = layer_devices(MIXED.n_layer, placement)
    assert output == output_device
    assert tuple(d for d, first, past in ranges for _ in range(first, past)) == layers
    sizer = Sizer(Candidate("m", shape=MIXED, layout=MIXED_LAYOUT), parallel, "f16", "f16")
    assert sizer.on(placement, window) == footprint_by_device(
        MIXED, MIXED_LAYOUT, placement, window, parallel
    )


@given(
    rooms=st.lists(st.integers(1, 1000), min_size=1, max_size=4),
    experts=st.booleans(),
    window=st.sampled_from([512, 1000, 4096, 20000]),
    parallel=st.integers(1, 3),
)
def test_splits_price_a_set_as_the_sizer_totals_it(
    rooms: list[int], experts: bool, window: int, parallel: int
) -> None:
    """A device set is priced from running sums of per-layer bytes, without footprints;
    every device's total is the sizer's, whatever the -ts shares (room, in any ratio)."""
    gpus = tuple(gpu(i, size * GiB) for i, size in enumerate(rooms))
    room = Room(Snapshot((*gpus, host(1000 * GiB)), ()))
    sizer = Sizer(Candidate("m", shape=MIXED, layout=MIXED_LAYOUT), parallel, "f16", "f16")
    held = Splits(sizer, room, [window], experts).held(tuple(g.id for g in gpus), 0)
    assert held is not None
    assert held.bytes == {d: f.total for d, f in sizer.on(held.placement, window).items()}


@given(
    n_layer=st.integers(1, 200),
    ngl=st.integers(1, 210),
    shares=st.lists(st.integers(1, 200) | st.floats(1e-3, 1e12), min_size=1, max_size=8),
)
def test_layer_ranges_are_layer_devices_run_length_encoded(
    n_layer: int, ngl: int, shares: list[float]
) -> None:
    """Boundaries found by arithmetic land where the engine's own float comparison puts
    them, also at exact layer counts (-ts 15,16) and at any ratio of bytes of room."""
    placement = Placement(tuple(f"gpu{i}" for i in range(len(shares))), ngl, tuple(shares))
    ranges, output = layer_ranges(n_layer, placement)
    layers, output_device = layer_devices(n_layer, placement)
    assert output == output_device
    assert tuple(d for d, first, past in ranges for _ in range(first, past)) == layers
