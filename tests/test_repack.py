"""The repack rule (core/repack.py): which tensors ggml-cpu repacks on which CPU, what that
costs in RAM, and the --no-repack placement the core falls back to when RAM is short."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fitbox.core import sizing, split
from fitbox.core.ask import Ask, Candidate, MeasuredFit
from fitbox.core.decide import decide
from fitbox.core.decision import Place, Refuse
from fitbox.core.norepack import without
from fitbox.core.repack import (
    MUL_MAT,
    MUL_MAT_ID,
    CpuFeatures,
    RepackReason,
    WeightTensor,
    host_weights,
    kernel,
    repacked,
)
from fitbox.core.split import Layout, Placement
from fitbox.core.types import Device, DeviceKind, Footprint, Rung, Snapshot

MIB = 1 << 20
X86 = CpuFeatures(frozenset({"SSE3", "AVX", "AVX2", "F16C", "FMA", "REPACK"}))
AVX512 = replace(X86, flags=X86.flags | {"AVX512"})
ARM = CpuFeatures(frozenset({"NEON", "DOTPROD", "MATMUL_INT8", "REPACK"}))
ARM_DOT = CpuFeatures(frozenset({"NEON", "DOTPROD", "REPACK"}))


@pytest.mark.parametrize(
    ("type_name", "rows", "cpu", "layout"),
    [
        ("Q4_0", 64, X86, "8x8"),
        ("Q4_0", 12, X86, None),
        ("Q4_0", 12, ARM, "4x8"),
        ("Q4_0", 12, ARM_DOT, "4x4"),
        ("Q4_K", 64, X86, "8x8"),
        ("Q4_K", 64, ARM_DOT, "8x4"),
        ("Q2_K", 64, X86, None),
        ("Q2_K", 64, AVX512, "8x8"),
        ("Q5_K", 64, X86, None),
        ("Q5_K", 64, ARM, "8x8"),
        ("Q6_K", 64, X86, None),
        ("Q6_K", 64, ARM_DOT, "8x4"),
        ("IQ4_NL", 64, X86, "8x8"),
        ("IQ4_NL", 12, ARM_DOT, "4x4"),
        ("MXFP4", 64, X86, "8x8"),
        ("Q8_0", 64, X86, None),
        ("Q8_0", 64, ARM, "4x8"),
        ("Q1_0", 64, ARM_DOT, "4x4"),
        ("IQ4_XS", 64, X86, None),
        ("Q4_1", 64, ARM, None),
        ("F16", 64, X86, None),
    ],
)
def test_the_kernel_table_of_repack_cpp(
    type_name: str, rows: int, cpu: CpuFeatures, layout: str | None
) -> None:
    assert kernel(type_name, rows, cpu) == layout


def tensor(
    layer: int,
    offset: int,
    n_bytes: int,
    type_name: str = "Q4_0",
    rows: int = 64,
    dims: int = 2,
    op: str = MUL_MAT,
) -> WeightTensor:
    return WeightTensor(layer, type_name, rows, dims, op, offset, n_bytes)


def test_only_matrix_products_the_buffer_type_supports_are_repacked() -> None:
    assert repacked(tensor(0, 0, 100), X86)
    assert not repacked(tensor(-1, 0, 100, op=""), X86)  # token_embd: GET_ROWS
    assert not repacked(tensor(0, 0, 100, dims=3), X86)  # a 3-D MUL_MAT
    assert repacked(tensor(0, 0, 100, dims=3, op=MUL_MAT_ID), X86)  # routed experts
    assert not repacked(tensor(0, 0, 100, dims=2, op=MUL_MAT_ID), X86)
    assert not repacked(tensor(0, 0, 100), replace(X86, flags=X86.flags - {"REPACK"}))
    assert not repacked(tensor(0, 0, 100), replace(X86, host_buffer=True))  # GPU host first


def test_the_mapped_span_shrinks_and_the_copies_are_aligned() -> None:
    tensors = (
        tensor(0, 1000, 100),  # repacked, first in the file: the mapping starts after it
        tensor(0, 1100, 50, type_name="F32", op=""),
        tensor(0, 1150, 70),  # repacked in the middle: still spanned
        tensor(0, 1220, 30, type_name="F32", op=""),
        tensor(1, 1250, 500),  # repacked last: the mapping ends before it
    )
    found = host_weights(tensors, X86)
    assert found.mapped == 1250 - 1100
    assert found.repacked == 128 + 96 + 512  # each copy padded to 32 bytes
    assert found.summed == 750 and found.extra == found.total - 750
    assert host_weights(tensors, None).extra == 0  # no features: the file's bytes alone
    in_layer_0 = host_weights(tensors, X86, lambda t: t.layer == 0)
    assert (in_layer_0.mapped, in_layer_0.repacked) == (150, 224)


def test_a_tied_output_is_mapped_once_and_repacked_as_a_copy_of_its_own() -> None:
    embd = tensor(-1, 0, 320, op="")
    dup = replace(embd, layer=2, op=MUL_MAT, duplicate=True)
    found = host_weights((embd, tensor(0, 320, 64), dup), X86)
    assert (found.mapped, found.repacked, found.summed) == (320, 64 + 320, 384)


SHAPE = sizing.ModelShape(
    weights_bytes=100 * MIB,
    n_layer=2,
    n_ctx_train=4096,
    n_embd=512,
    n_vocab=112,
    n_head=8,
    kv_heads=(4, 4),
    key_length=64,
    value_length=64,
    n_ff=1536,
    tensors=(
        tensor(-1, 0, 10 * MIB, op=""),
        tensor(0, 10 * MIB, 40 * MIB),
        tensor(1, 50 * MIB, 40 * MIB),
        tensor(2, 90 * MIB, 10 * MIB, type_name="Q6_K"),
    ),
)
LAYOUT = Layout((40 * MIB, 40 * MIB), (0, 0), 10 * MIB, 10 * MIB, False)


def test_the_footprint_follows_the_rule_in_ram_only() -> None:
    plain = sizing.footprint(SHAPE, 1024, 1)
    packed = sizing.footprint(SHAPE, 1024, 1, cpu=X86)
    assert packed.weights == plain.weights + 80 * MIB  # the span stays, the copies join it
    assert sizing.footprint(SHAPE, 1024, 1, cpu=replace(X86, host_buffer=True)) == plain
    # partial offload: only the layer left in RAM is copied; layers on a GPU never are
    one_on_gpu = Placement(("gpu0",), gpu_layers=2)  # layer 1 and the output on the GPU
    by_device = split.footprint_by_device(SHAPE, LAYOUT, one_on_gpu, 1024, 1, cpu=X86)
    found = split.in_ram(SHAPE, one_on_gpu, X86)
    assert found is not None and (found.mapped, found.repacked) == (10 * MIB, 40 * MIB)
    assert by_device["host"].weights == 10 * MIB + 40 * MIB  # token_embd mapped, layer 0 copied
    assert by_device["gpu0"].weights == 50 * MIB


def candidate(cpu: CpuFeatures | None = X86, **kw: object) -> Candidate:
    return Candidate(key="m.gguf", quant="Q4_0", shape=SHAPE, layout=LAYOUT, cpu=cpu, **kw)  # type: ignore[arg-type]


def host_box(capacity: int) -> Snapshot:
    return Snapshot(devices=(Device("host", DeviceKind.HOST, capacity),), residents=())


def ask(c: Candidate) -> Ask:
    return Ask(model="m", candidates=(c,), window=512, rungs=(Rung.RAM_ONLY,))


def test_with_room_the_repacked_copy_is_kept_and_shown() -> None:
    place = decide(host_box(8 << 30), ask(candidate()))
    assert isinstance(place, Place) and place.repack is RepackReason.ON
    assert not place.no_repack and place.where == "host"
    assert dict(place.footprint)["host"].weights == 180 * MIB


def test_when_only_the_unrepacked_file_fits_the_core_chooses_no_repack() -> None:
    need = sizing.footprint(SHAPE, 512, 1)
    place = decide(host_box(need.total + 10 * MIB), ask(candidate()))
    assert isinstance(place, Place) and place.no_repack
    assert place.repack is RepackReason.RAM_BOUND and place.where == "host/no-repack"
    assert dict(place.footprint)["host"] == need
    assert [r.reason.value for r in place.rejected] == ["larger_than_box"]  # the copy's miss


def test_nothing_to_repack_means_no_flag_and_no_second_try() -> None:
    for c in (candidate(cpu=None), candidate(cpu=CpuFeatures())):
        place = decide(host_box(8 << 30), ask(c))
        assert isinstance(place, Place) and place.repack is RepackReason.NONE
    tight = sizing.footprint(SHAPE, 512, 1).total - 1
    refused = decide(host_box(tight), ask(candidate()))
    assert isinstance(refused, Refuse) and refused.needed == tight + 1  # the nearest miss
    assert without(candidate(), Rung.GPU_ONLY) is None  # no weights in RAM on that rung


def test_facts_of_a_no_repack_load_price_only_no_repack_placements() -> None:
    small = Footprint(50 * MIB, 0, 0, 0)
    c = candidate(
        measured=(MeasuredFit("host/no-repack", 512, "f16", "f16", small),),
        refused_windows=(("host", 512),),
    )
    plain = without(c, Rung.RAM_ONLY)
    assert plain is not None and plain.no_repack
    assert plain.measured_fit("host", 512, "f16", "f16") == small
    assert c.measured_fit("host", 512, "f16", "f16") is None
    assert plain.window_cap("host") is None and c.window_cap("host") == 512
    place = decide(host_box(8 << 30), ask(c))  # the repacked window failed: no-repack is next
    assert isinstance(place, Place) and place.no_repack and dict(place.footprint)["host"] == small


def test_a_rejection_no_ram_changes_is_not_tried_again_without_the_copy() -> None:
    only_host = Ask(
        model="m",
        candidates=(candidate(),),
        window=512,
        rungs=(Rung.MOE_SPLIT, Rung.MAX_RAM, Rung.RAM_ONLY),
    )
    place = decide(host_box(8 << 30), only_host)
    assert isinstance(place, Place) and place.repack is RepackReason.ON
    reasons = [(r.rung, r.reason.value) for r in place.rejected]
    assert reasons == [(Rung.MOE_SPLIT, "no_gpu"), (Rung.MAX_RAM, "no_gpu")]  # once each
