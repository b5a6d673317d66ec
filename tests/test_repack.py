"""The repack rule (core/repack.py): which tensors ggml-cpu repacks on which CPU, and what
that costs in RAM."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fitbox.core import sizing, split
from fitbox.core.repack import (
    MUL_MAT,
    MUL_MAT_ID,
    CpuFeatures,
    WeightTensor,
    host_weights,
    kernel,
    repacked,
)
from fitbox.core.split import Layout, Placement

MIB = 1 << 20
X86 = CpuFeatures(frozenset({"SSE3", "AVX", "AVX2", "F16C", "FMA", "REPACK"}))
AVX512 = replace(X86, flags=X86.flags | {"AVX512"})
ARM = CpuFeatures(frozenset({"NEON", "DOTPROD", "MATMUL_INT8", "REPACK"}))
ARM_DOT = CpuFeatures(frozenset({"NEON", "DOTPROD", "REPACK"}))


@pytest.mark.parametrize(
    ("type_name", "rows", "cpu", "layout"),
    [
        ("Q4_0", 64, X86, "8x8"), ("Q4_0", 12, X86, None), ("Q4_0", 12, ARM, "4x8"),
        ("Q4_0", 12, ARM_DOT, "4x4"), ("Q4_K", 64, X86, "8x8"), ("Q4_K", 64, ARM_DOT, "8x4"),
        ("Q2_K", 64, X86, None), ("Q2_K", 64, AVX512, "8x8"), ("Q5_K", 64, X86, None),
        ("Q5_K", 64, ARM, "8x8"), ("Q6_K", 64, X86, None), ("Q6_K", 64, ARM_DOT, "8x4"),
        ("IQ4_NL", 64, X86, "8x8"), ("IQ4_NL", 12, ARM_DOT, "4x4"), ("MXFP4", 64, X86, "8x8"),
        ("Q8_0", 64, X86, None), ("Q8_0", 64, ARM, "4x8"), ("Q1_0", 64, ARM_DOT, "4x4"),
        ("IQ4_XS", 64, X86, None), ("Q4_1", 64, ARM, None), ("F16", 64, X86, None),
    ],
)  # fmt: skip
def test_the_kernel_table_of_repack_cpp(
    type_name: str, rows: int, cpu: CpuFeatures, layout: str | None
) -> None:
    assert kernel(type_name, rows, cpu) == layout


def tensor(layer: int, offset: int, n_bytes: int, type_name: str = "Q4_0", rows: int = 64,
           dims: int = 2, op: str = MUL_MAT) -> WeightTensor:  # fmt: skip
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
    weights_bytes=100 * MIB, n_layer=2, n_ctx_train=4096, n_embd=512, n_vocab=112, n_head=8,
    kv_heads=(4, 4), key_length=64, value_length=64, n_ff=1536,
    tensors=(tensor(-1, 0, 10 * MIB, op=""), tensor(0, 10 * MIB, 40 * MIB),
             tensor(1, 50 * MIB, 40 * MIB), tensor(2, 90 * MIB, 10 * MIB, type_name="Q6_K")),
)  # fmt: skip
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
