"""Multi-GPU placement, the window first (issue #21): the largest window any set of GPUs
holds wins; among the sets that hold it, the fewest GPUs, then the cheapest eviction, then
the most room left. Pure: no I/O, no clocks, no processes."""

from __future__ import annotations

from fitbox.core.ask import Ask
from fitbox.core.decide import decide
from fitbox.core.decision import CountReason, Place, RejectReason
from fitbox.core.types import Footprint, Snapshot
from tests.support.core_builders import GiB, MiB, gpu, host, resident, smollm2

CORES = tuple(range(8))


def box(*mib: int, residents: tuple[object, ...] = ()) -> Snapshot:
    gpus = tuple(gpu(i, size * MiB) for i, size in enumerate(mib))
    return Snapshot((*gpus, host(GiB)), residents, cores=CORES)  # type: ignore[arg-type]


def place(snapshot: Snapshot, **ask: object) -> Place:
    """SmolLM2 asked at a 4096-token window unless ``ask`` says otherwise."""
    wanted: dict[str, object] = {"window": 4096, **ask}
    decision = decide(snapshot, Ask("smollm2", (smollm2(),), **wanted))  # type: ignore[arg-type]
    assert isinstance(decision, Place), decision
    return decision


def counts(decision: Place) -> list[tuple[int, int, str]]:
    return [(c.count, c.window, c.reason.value) for c in decision.device_counts]


def test_two_150_mib_gpus_split_at_4096_rather_than_one_gpu_at_1536() -> None:
    decision = place(box(150, 150))
    assert decision.window == 4096 and decision.devices == ("gpu0", "gpu1", "host")
    assert decision.tensor_split == (150 * MiB, 150 * MiB)
    assert counts(decision) == [(1, 1536, "smaller_window"), (2, 4096, "chosen")]
    # 31 slots, half each by room: 16 layers on gpu0; 14 and the output layer on gpu1, which
    # for a tied output is a copy of the token embeddings
    on = dict(decision.footprint)
    assert on["gpu0"].weights == 16 * 2_216_448
    assert on["gpu1"].weights == 14 * 2_216_448 + 2304 + 30_081_024
    assert all(f.total <= 150 * MiB for d, f in decision.footprint if d != "host")


def test_three_110_mib_gpus_split_over_all_three_at_4096() -> None:
    decision = place(box(110, 110, 110))
    assert decision.window == 4096 and decision.devices == ("gpu0", "gpu1", "gpu2", "host")
    assert counts(decision) == [
        (1, 0, "no_window"),
        (2, 3072, "smaller_window"),
        (3, 4096, "chosen"),
    ]


def test_three_100_mib_gpus_split_over_all_three_at_4096() -> None:
    decision = place(box(100, 100, 100))
    assert decision.window == 4096 and len(decision.tensor_split) == 3
    assert counts(decision)[1] == (2, 3072, "smaller_window")


def test_four_80_mib_gpus_split_over_all_four_at_4096() -> None:
    decision = place(box(80, 80, 80, 80))
    assert decision.window == 4096 and decision.devices[:4] == ("gpu0", "gpu1", "gpu2", "gpu3")
    assert counts(decision) == [
        (1, 0, "no_window"),
        (2, 1024, "smaller_window"),
        (3, 3072, "smaller_window"),
        (4, 4096, "chosen"),
    ]


def test_one_gpu_when_it_holds_the_window_a_split_would_give() -> None:
    decision = place(box(150, 300))
    assert decision.devices == ("gpu1", "host") and decision.tensor_split == ()
    assert counts(decision) == [(1, 4096, "chosen"), (2, 4096, "more_devices")]


def test_fewest_gpus_before_eviction_and_the_reason_is_named() -> None:
    """One GPU that must evict an idle model beats two that need not: the rule's order. The
    two-GPU count shows its window, that it would evict nothing, and why it lost."""
    idle = resident("idle", 200 * MiB, device="gpu0")
    decision = place(box(300, 150, 150, residents=(idle,)))
    assert decision.devices == ("gpu0", "host") and [v.key for v in decision.victims] == ["idle"]
    two = decision.device_counts[1]
    assert (two.window, two.victims, two.reason) == (4096, (), CountReason.MORE_DEVICES)
    assert two.gpus == ("gpu1", "gpu2")


def test_among_splits_of_as_many_gpus_the_one_that_evicts_nothing() -> None:
    idle = resident("idle", 100 * MiB, device="gpu0")
    decision = place(box(150, 150, 150, residents=(idle,)))
    assert decision.window == 4096 and decision.victims == ()
    assert decision.devices == ("gpu1", "gpu2", "host")


def test_a_split_by_layer_counts_when_shares_by_room_do_not_hold_the_window() -> None:
    """200 + 60 MiB: split by room, the small last GPU would take a quarter of the layers and
    the output layer; by layer counts it takes the output layer alone, which fits."""
    decision = place(box(200, 60))
    assert decision.window == 4096 and decision.tensor_split == (30.0, 1.0)
    on = dict(decision.footprint)
    assert on["gpu1"].kv == 0 and on["gpu1"].weights == 30_081_024 + 2304  # output + embeddings
    assert all(on[g].total <= cap * MiB for g, cap in (("gpu0", 200), ("gpu1", 60)))


def test_kv_types_a_quantized_cache_before_a_smaller_window() -> None:
    decision = place(box(150), kv_types=(("f16", "f16"), ("q8_0", "q8_0")))
    assert (decision.type_k, decision.window) == ("q8_0", 3072)
    (f16,) = [r for r in decision.rejected if r.kv == "f16/f16"]
    assert f16.reason is RejectReason.SMALLER_WINDOW and "1536" in f16.detail


def test_kv_types_f16_on_two_gpus_before_q8_0_on_one() -> None:
    decision = place(box(150, 150), kv_types=(("f16", "f16"), ("q8_0", "q8_0")))
    assert (decision.type_k, decision.window, len(decision.tensor_split)) == ("f16", 4096, 2)


def test_kv_types_the_window_first_across_splits_too() -> None:
    decision = place(box(110, 110), kv_types=(("f16", "f16"), ("q8_0", "q8_0")))
    assert (decision.type_k, decision.window) == ("q8_0", 4096)
    assert counts(decision) == [(1, 0, "no_window"), (2, 4096, "chosen")]


def test_parallel_slots_take_the_same_rule() -> None:
    decision = place(box(150, 150), parallel=2)
    assert decision.window == 4096 and len(decision.tensor_split) == 2
    assert counts(decision) == [(1, 1536, "smaller_window"), (2, 4096, "chosen")]


def test_one_gpu_boxes_and_host_placements_carry_no_device_counts() -> None:
    assert place(box(300)).device_counts == ()
    assert place(Snapshot((host(GiB),), (), cores=CORES)).device_counts == ()


def test_the_chosen_split_never_lists_a_gpu_that_holds_nothing() -> None:
    decision = place(box(150, 150, 1))
    assert "gpu2" not in decision.devices and "gpu2" not in dict(decision.footprint)
    assert decision.footprint and all(isinstance(f, Footprint) for _, f in decision.footprint)


def test_a_set_ending_on_a_roomier_gpu_when_the_last_of_the_roomiest_is_too_small() -> None:
    """The last GPU in the engine's order takes the output layer (here the tied embeddings,
    ~29 MiB, more than five layers). The three roomiest end on gpu3 (44 MiB), too small for
    it with its compute buffer; three that end on gpu2 hold more than any two."""
    decision = place(box(80, 30, 80, 44), window=8192)
    assert decision.devices == ("gpu0", "gpu1", "gpu2", "host") and decision.window == 1536
    assert counts(decision)[1:3] == [(2, 1024, "smaller_window"), (3, 1536, "chosen")]
