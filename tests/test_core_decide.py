"""The placement core, one scenario per rule (issue #4). Pure: no I/O, no clocks, no processes."""

from __future__ import annotations

from fitbox.core import sizing
from fitbox.core.ask import Ask, MeasuredFit, Speeds
from fitbox.core.costs import Sizer
from fitbox.core.decide import decide, window_ticks
from fitbox.core.decision import (
    BandKind,
    Place,
    Refuse,
    RefuseReason,
    Wait,
    WaitReason,
)
from fitbox.core.split import Placement
from fitbox.core.types import Footprint, Goal, Reservation, ResidentState, Rung, Snapshot
from tests.support.core_builders import GiB, fixed, gpu, host, model, resident

CORES = tuple(range(8))


def place(snapshot: Snapshot, ask: Ask) -> Place:
    decision = decide(snapshot, ask)
    assert isinstance(decision, Place), decision
    return decision


def reasons(decision: Place | Wait | Refuse) -> dict[tuple[str, str], str]:
    return {(r.artifact, r.rung.value): r.reason.value for r in decision.rejected}


# -- eviction -------------------------------------------------------------------------------


def test_eviction_nothing_leaves_when_the_model_fits_as_is() -> None:
    snap = Snapshot((host(10 * GiB),), (resident("a", 4 * GiB),))
    assert place(snap, Ask("b", (fixed("b", 5 * GiB),))).victims == ()


def test_eviction_least_cost_first_reload_seconds_times_band() -> None:
    snap = Snapshot(
        (host(10 * GiB),),
        (
            resident("slow-to-reload", 4 * GiB, reload_seconds=40.0, last_used=0.0),
            resident("quick", 4 * GiB, reload_seconds=2.0, last_used=9.0),
            resident("important", 4 * GiB, reload_seconds=1.0, band=10, last_used=1.0),
        ),
    )
    snap = Snapshot((host(14 * GiB),), snap.residents)
    decision = place(snap, Ask("c", (fixed("c", 5 * GiB),)))
    assert [v.key for v in decision.victims] == ["quick"]  # cost 2 < 10 (1 s x band 10) < 40


def test_eviction_frees_enough_on_the_right_device() -> None:
    snap = Snapshot(
        (gpu(0, 10 * GiB), gpu(1, 10 * GiB)),
        (
            resident("a", 8 * GiB, device="gpu0", reload_seconds=1.0),
            resident("b", 5 * GiB, device="gpu1", reload_seconds=1.0),
        ),
    )
    decision = place(snap, Ask("m", (fixed("m", 6 * GiB),), rungs=(Rung.GPU_ONLY,)))
    assert decision.device == "gpu1" and [v.key for v in decision.victims] == ["b"]


def test_eviction_never_a_serving_loading_or_pinned_resident() -> None:
    for blocker in (
        resident("x", 8 * GiB, calls=1),
        resident("x", 8 * GiB, state=ResidentState.STARTING),
    ):
        decision = decide(Snapshot((host(10 * GiB),), (blocker,)), Ask("b", (fixed("b", 5 * GiB),)))
        assert isinstance(decision, Wait) and decision.blockers == ("x",)
        assert decision.reason is WaitReason.BUSY_RESIDENTS and decision.bound == 120.0
    pinned = resident("keep", 8 * GiB, pinned=True)
    decision = decide(Snapshot((host(10 * GiB),), (pinned,)), Ask("b", (fixed("b", 5 * GiB),)))
    assert isinstance(decision, Refuse) and decision.reason is RefuseReason.HELD_BY_PINNED
    assert decision.holders == ("keep",) and decision.needed == 5 * GiB
    assert decision.available == 2 * GiB


# -- rungs ----------------------------------------------------------------------------------


def test_rungs_gpu_only_first() -> None:
    decision = place(
        Snapshot((gpu(0, 24 * GiB), host(64 * GiB)), (), cores=CORES),
        Ask("m", (model("m", 8 * GiB),)),
    )
    assert decision.rung is Rung.GPU_ONLY and decision.devices == ("gpu0", "host")
    assert decision.gpu_layers == 33 and decision.tensor_split == ()
    assert decision.cores == (1,)  # a GPU-only engine gets one core; core 0 stays for the OS


def test_rungs_moe_split_keeps_experts_in_ram_and_only_for_moe_models() -> None:
    snap = Snapshot((gpu(0, 6 * GiB), host(64 * GiB)), (), cores=CORES)
    moe = place(snap, Ask("m", (model("moe", 12 * GiB, moe=True),)))
    assert moe.rung is Rung.MOE_SPLIT and moe.experts_in_ram
    assert moe.bytes_on("gpu0") < 6 * GiB < moe.bytes_on("host")
    dense = place(snap, Ask("d", (model("dense", 12 * GiB),)))
    assert reasons(dense)[("dense", "moe-split")] == "not_moe"
    assert dense.rung is not Rung.MOE_SPLIT


def test_rungs_four_bit_loads_the_approved_q4_variant_before_leaving_the_gpu() -> None:
    snap = Snapshot((gpu(0, 6 * GiB), host(64 * GiB)), (), cores=CORES)
    variants = (model("q8", 8 * GiB), model("q4", 4 * GiB, quant="Q4_K_M", four_bit=True))
    decision = place(snap, Ask("m", variants))
    assert (decision.rung, decision.artifact) == (Rung.FOUR_BIT, "q4")
    alone = place(snap, Ask("m", variants[:1]))
    assert reasons(alone)[("q8", "4bit")] == "no_four_bit_variant"
    assert alone.rung is Rung.RAM_ONLY


def test_rungs_ram_only_then_max_ram_then_max_gpu() -> None:
    snap = Snapshot((gpu(0, 6 * GiB), host(12 * GiB)), (), cores=CORES)
    decision = place(snap, Ask("m", (model("m", 16 * GiB),)))
    assert decision.rung is Rung.MAX_RAM and 0 < decision.gpu_layers < 33
    greedy = place(snap, Ask("m", (model("m", 16 * GiB),), rungs=(Rung.MAX_GPU,)))
    assert greedy.gpu_layers > decision.gpu_layers  # max-gpu: the most layers the GPU holds
    assert greedy.bytes_on("gpu0") <= 6 * GiB and decision.bytes_on("host") <= 12 * GiB
    one_more = place(
        snap, Ask("m", (model("m", 16 * GiB),), rungs=(Rung.MAX_GPU,), window=greedy.window)
    )
    assert one_more.gpu_layers == greedy.gpu_layers


def test_rungs_step_down_to_the_next_variant_when_every_rung_fails() -> None:
    snap = Snapshot((gpu(0, 4 * GiB), host(4 * GiB)), (), cores=CORES)
    decision = place(snap, Ask("m", (model("f16", 16 * GiB, quant="F16"), model("q8", 6 * GiB))))
    assert decision.artifact == "q8" and decision.rung is Rung.MAX_RAM
    assert all(
        v == "larger_than_box"
        for (a, r), v in reasons(decision).items()
        if a == "f16" and r in ("gpu-only", "ram-only", "max-ram", "max-gpu")
    )


def test_rungs_a_bad_artifact_is_terminal_never_a_quant_change() -> None:
    snap = Snapshot((host(64 * GiB),), ())
    bad = model("q8", 6 * GiB, terminal="tensor data runs past the end of the file")
    decision = decide(snap, Ask("m", (bad, model("q4", 4 * GiB, four_bit=True))))
    assert isinstance(decision, Refuse) and decision.reason is RefuseReason.BAD_ARTIFACT
    assert "past the end" in decision.detail


def test_rungs_weights_in_ram_need_the_cpu_floor() -> None:
    busy = resident("other", GiB, calls=1, cores=(1, 2, 3, 4, 5, 6))
    snap = Snapshot((host(64 * GiB),), (busy,), cores=CORES)
    decision = decide(snap, Ask("m", (model("m", 4 * GiB),), cpu_floor=2))
    assert isinstance(decision, Wait) and decision.blockers == ("other",)
    assert reasons(decision)[("m", "ram-only")] == "no_cores"
    assert place(snap, Ask("m", (model("m", 4 * GiB),), cpu_floor=1)).cores == (7,)


def test_rungs_pins_narrow_the_ladder_and_the_quant() -> None:
    snap = Snapshot((gpu(0, 24 * GiB), host(64 * GiB)), (), cores=CORES)
    variants = (model("q8", 8 * GiB), model("q4", 4 * GiB, quant="Q4_K_M", four_bit=True))
    assert place(snap, Ask("m", variants, rungs=(Rung.RAM_ONLY,))).rung is Rung.RAM_ONLY
    assert place(snap, Ask("m", variants, quant="q4_k_m")).artifact == "q4"
    nothing = decide(snap, Ask("m", variants, quant="IQ2_XS"))
    assert isinstance(nothing, Refuse) and nothing.reason is RefuseReason.NO_CANDIDATE


# -- context bands --------------------------------------------------------------------------


def test_context_bands_range_point_and_infeasible() -> None:
    snap = Snapshot((host(64 * GiB),), ())
    wide = place(snap, Ask("m", (model("m", 4 * GiB),), window=16384))
    assert wide.band is not None and wide.band.kind is BandKind.RANGE
    assert (wide.band.feasible_min, wide.band.feasible_max, wide.window) == (512, 16384, 16384)
    # a host just big enough for the smallest window the call needs: a point
    at_3072 = sizing.footprint(model("m", 4 * GiB).shape, 3072, 1)  # type: ignore[arg-type]
    tight = Snapshot((host(at_3072.total),), ())
    point = place(tight, Ask("m", (model("m", 4 * GiB),), need=3000, window=16384))
    assert point.band is not None and point.band.kind is BandKind.POINT
    assert point.window == 3072
    none = decide(
        Snapshot((host(int(4.2 * GiB)),), ()), Ask("m", (model("m", 4 * GiB),), need=30000)
    )
    assert isinstance(none, Refuse) and none.reason is RefuseReason.LARGER_THAN_BOX


def test_context_bands_a_refused_window_is_out_of_reach_until_a_success_above_it() -> None:
    snap = Snapshot((host(64 * GiB),), ())
    refused = model("m", 4 * GiB, refused_windows=(("host", 8192),))
    decision = place(snap, Ask("m", (refused,), window=16384))
    assert decision.window == 6144  # the tick below the failure
    too_big = decide(snap, Ask("m", (refused,), need=9000))
    assert isinstance(too_big, Refuse) and too_big.reason is RefuseReason.CONTEXT
    healed = model(
        "m", 4 * GiB, refused_windows=(("host", 8192),), loaded_windows=(("host", 12288),)
    )
    assert place(snap, Ask("m", (healed,), window=16384)).window == 16384


def test_context_bands_beyond_the_training_context_is_refused_as_context() -> None:
    snap = Snapshot((host(64 * GiB),), ())
    decision = decide(snap, Ask("m", (model("m", GiB, n_ctx_train=2048),), need=4096))
    assert isinstance(decision, Refuse) and decision.reason is RefuseReason.CONTEXT
    capped = place(snap, Ask("m", (model("m", GiB, n_ctx_train=2048),), window=8192))
    assert capped.window == 2048


def test_context_bands_ticks_are_the_ladder() -> None:
    assert window_ticks(512, 8192) == [512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192]
    assert window_ticks(1000, 5000) == [1024, 1536, 2048, 3072, 4096, 5000]


def test_context_bands_quantized_kv_when_f16_does_not_fit() -> None:
    m = model("m", 4 * GiB)
    f16 = Sizer(m, 1, "f16", "f16").on(Placement(("gpu0",), 33), 24576)["gpu0"].total
    snap = Snapshot((gpu(0, f16 - 1), host(GiB)), (), cores=CORES)
    ask = Ask(
        "m",
        (model("m", 4 * GiB),),
        window=32768,
        need=20000,
        rungs=(Rung.GPU_ONLY,),
        kv_types=(("f16", "f16"), ("q8_0", "q8_0")),
    )
    decision = place(snap, ask)
    assert (decision.type_k, decision.type_v) == ("q8_0", "q8_0")


# -- multi-GPU ------------------------------------------------------------------------------


def test_multi_gpu_prefers_one_gpu_that_fits() -> None:
    snap = Snapshot((gpu(0, 24 * GiB), gpu(1, 10 * GiB), host(64 * GiB)), (), cores=CORES)
    decision = place(snap, Ask("m", (model("m", 8 * GiB),)))
    assert decision.devices == ("gpu1", "host")  # the best fit; the 24 GiB hole stays whole


def test_multi_gpu_splits_across_the_fewest_proportional_to_free_memory() -> None:
    snap = Snapshot((gpu(0, 8 * GiB), gpu(1, 4 * GiB), gpu(2, 6 * GiB), host(GiB)), (), cores=CORES)
    decision = place(snap, Ask("m", (model("m", 12 * GiB),), rungs=(Rung.GPU_ONLY,)))
    assert decision.devices == ("gpu0", "gpu2", "host")  # two GPUs, the two with most room
    assert decision.tensor_split == (8 * GiB, 6 * GiB)
    assert "gpu1" not in dict(decision.footprint)  # never a device it does not need


# -- goals ----------------------------------------------------------------------------------


def _timed(load: float, decode: float) -> Speeds:
    return Speeds(load_seconds=load, prompt_ms=1.0, decode_ms=decode)


def test_goals_quality_keeps_the_best_variant_fast_takes_the_quickest() -> None:
    snap = Snapshot((gpu(0, 6 * GiB), host(64 * GiB)), (), cores=CORES)
    q8 = model("q8", 8 * GiB, speeds=((Rung.RAM_ONLY, _timed(5, 200)),))
    timed = ((Rung.GPU_ONLY, _timed(3, 10)), (Rung.RAM_ONLY, _timed(3, 100)))
    q4 = model("q4", 4 * GiB, quant="Q4_K_M", four_bit=True, speeds=timed)
    ask = Ask("m", (q8, q4), rungs=(Rung.GPU_ONLY, Rung.RAM_ONLY), max_tokens=100)
    assert place(snap, ask).artifact == "q8"  # quality: q first
    fast = place(
        snap,
        Ask("m", (q8, q4), rungs=(Rung.GPU_ONLY, Rung.RAM_ONLY), max_tokens=100, goal=Goal.FAST),
    )
    assert (fast.artifact, fast.rung) == ("q4", Rung.GPU_ONLY)
    assert fast.predicted_seconds == 3 + 100 * 10 / 1000


def test_goals_a_speed_is_never_invented_unmeasured_keeps_ladder_order() -> None:
    snap = Snapshot((gpu(0, 6 * GiB), host(64 * GiB)), (), cores=CORES)
    q8 = model("q8", 8 * GiB)  # unmeasured
    q4 = model("q4", 4 * GiB, four_bit=True, speeds=((Rung.GPU_ONLY, _timed(1, 1)),))
    decision = place(snap, Ask("m", (q8, q4), goal=Goal.FAST, max_tokens=10))
    assert (decision.artifact, decision.rung) == ("q4", Rung.GPU_ONLY)  # ladder: gpu first
    assert decision.predicted_seconds is not None
    quality = place(snap, Ask("m", (q8, q4), max_tokens=10))
    assert quality.rung is Rung.FOUR_BIT and quality.predicted_seconds is not None


def test_goals_resident_keeps_hot_residents() -> None:
    snap = Snapshot(
        (host(12 * GiB),),
        (
            resident("hot", 6 * GiB, band=5, reload_seconds=1.0),
            resident("cold", 2 * GiB, reload_seconds=30.0),
        ),
        cores=CORES,
    )
    speeds = ((Rung.RAM_ONLY, _timed(1, 1)),)
    q8 = model("q8", 8 * GiB, speeds=speeds)
    q4 = model("q4", 3 * GiB, four_bit=True, speeds=speeds)
    resident_goal = place(snap, Ask("m", (q8, q4), goal=Goal.RESIDENT, rungs=(Rung.RAM_ONLY,)))
    assert resident_goal.artifact == "q8" and [v.key for v in resident_goal.victims] == ["hot"]
    # q8 can only fit by displacing the hot one; E_hot counts only after q, so q8 still wins;
    # between two placements of the same variant, the one that keeps the hot resident wins
    assert resident_goal.victims[0].cost == 5.0


def test_goals_waiting_is_chosen_only_when_room_is_expected_within_the_max_wait() -> None:
    busy = resident("busy", 20 * GiB, device="gpu0", calls=1, eta_idle=5.0)
    snap = Snapshot((gpu(0, 24 * GiB), host(64 * GiB)), (busy,), cores=CORES)
    decision = decide(snap, Ask("m", (model("m", 8 * GiB),), max_wait=30))
    assert isinstance(decision, Wait) and decision.reason is WaitReason.BETTER_SOON
    assert decision.blockers == ("busy",) and decision.bound == 5.0
    impatient = place(snap, Ask("m", (model("m", 8 * GiB),), max_wait=2))
    assert impatient.rung is Rung.RAM_ONLY
    unknown = Snapshot(
        snap.devices, (resident("busy", 20 * GiB, device="gpu0", calls=1),), cores=CORES
    )
    assert place(unknown, Ask("m", (model("m", 8 * GiB),), max_wait=30)).rung is Rung.RAM_ONLY


# -- tiers, reservations, measured facts ----------------------------------------------------


def test_reservations_count_against_the_room() -> None:
    snap = Snapshot((host(10 * GiB),), (), reservations=(Reservation("host", 6 * GiB, "cache"),))
    decision = decide(snap, Ask("m", (fixed("m", 5 * GiB),)))
    assert isinstance(decision, Refuse) and decision.available == 4 * GiB


def test_measured_footprints_replace_the_estimate_for_their_placement() -> None:
    measured = MeasuredFit("host", 4096, "f16", "f16", Footprint(9 * GiB, 0, 0, 0))
    snap = Snapshot((host(10 * GiB),), ())
    estimate = place(snap, Ask("m", (model("m", 4 * GiB),)))
    assert estimate.bytes_on("host") < 5 * GiB
    remeasured = place(snap, Ask("m", (model("m", 4 * GiB, measured=(measured,)),)))
    assert remeasured.bytes_on("host") == 9 * GiB and remeasured.window == 4096


def test_multi_gpu_shares_follow_the_engines_order_past_gpu9() -> None:
    """-ts shares are positional: the engine numbers GPUs 0, 1, ..., 10, so a split over gpu2
    and gpu10 lists gpu2 first (sorted by name, gpu10 would come before gpu2)."""
    devices = [gpu(i, 2 * GiB) for i in range(11)]
    devices[2], devices[10] = gpu(2, 7 * GiB), gpu(10, 8 * GiB)
    snap = Snapshot((*devices, host(GiB)), (), cores=CORES)
    decision = place(snap, Ask("m", (model("m", 12 * GiB),), rungs=(Rung.GPU_ONLY,)))
    assert decision.devices == ("gpu2", "gpu10", "host")
    assert decision.tensor_split == (7 * GiB, 8 * GiB)


# -- a lowered cap --------------------------------------------------------------------------


def test_a_lowered_cap_stops_the_cheapest_idle_set_and_names_what_it_cannot() -> None:
    from fitbox.core.evict import over_caps

    idle_old = resident("old", 3 * GiB, reload_seconds=1.0, last_used=1.0)
    idle_new = resident("new", 3 * GiB, reload_seconds=1.0, last_used=5.0)
    serving = resident("busy", 4 * GiB, calls=1)
    pinned = resident("keep", 2 * GiB, pinned=True)
    on_gpu = resident("gpu", 6 * GiB, device="gpu0")
    everyone = (idle_old, idle_new, serving, pinned, on_gpu)
    assert over_caps({"host": 12 * GiB}, everyone) == ([], {})  # 12 GiB held: fits
    leaving, still = over_caps({"host": 9 * GiB}, everyone)  # 3 GiB over: one idle one
    assert [r.key for r in leaving] == ["old"] and still == {}
    leaving, still = over_caps({"host": 4 * GiB}, everyone)  # 8 over: both idle, 2 remain
    assert [r.key for r in leaving] == ["old", "new"] and still == {"host": 2 * GiB}
    leaving, still = over_caps({"host": 6 * GiB, "gpu0": 1 * GiB}, (serving, pinned, on_gpu))
    assert [r.key for r in leaving] == ["gpu"] and still == {}


def test_a_model_a_loading_resident_keeps_off_the_only_gpu_that_holds_it_waits() -> None:
    """hypothesis found it (test_invariants): the model fills an empty gpu0 exactly, a
    resident still loading holds a little of gpu0, gpu1 is too small. The call waits for
    the loading one to settle (then leave); the miss was explained by the roomiest GPU now,
    gpu1, and refused as larger than the box."""
    loading = resident("r1", GiB // 4, device="gpu0", state=ResidentState.STARTING)
    snap = Snapshot((gpu(0, 6 * GiB), gpu(1, 4 * GiB)), (loading,), cores=CORES)
    ask = Ask("m", (fixed("m", 6 * GiB, partial_offload=True),), max_wait=300.0)
    decision = decide(snap, ask)
    assert isinstance(decision, Wait) and decision.blockers == ("r1",), decision
    too_big = decide(snap, Ask("m", (fixed("m", 7 * GiB, partial_offload=True),), max_wait=300.0))
    assert isinstance(too_big, Refuse) and too_big.reason is RefuseReason.LARGER_THAN_BOX
