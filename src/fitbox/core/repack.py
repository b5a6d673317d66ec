"""Repacked weights: which tensors llama.cpp's CPU backend copies into an interleaved
layout, what that costs in RAM, and when fitbox turns it off with ``--no-repack``. Pure.

On a CPU whose instructions have a kernel for it, ggml-cpu's ``CPU_REPACK`` buffer type takes
a weight its matrix products use, and the copy sits in anonymous memory beside the mapped
file; the tensors left in the mapping still span the file from the first to the last of
them. Every rule below mirrors the build fitbox runs, with its source lines in FORMULAS.md
§Repacked weights (``ggml/src/ggml-cpu/repack.cpp``, ``src/llama-model.cpp``,
``src/llama-model-loader.cpp``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum

TENSOR_ALIGNMENT = 32  # ggml-impl.h: the repack buffer aligns every tensor to it
MUL_MAT = "mul_mat"
MUL_MAT_ID = "mul_mat_id"
NO_REPACK_CLASS = "/no-repack"  # measured facts of a --no-repack load are filed apart


@dataclass(frozen=True)
class CpuFeatures:
    """What the engine's CPU backend reports when it starts (llama-server's ``system_info``
    line: ``CPU : SSE3 = 1 | AVX2 = 1 | ... | REPACK = 1 |``)."""

    flags: frozenset[str] = frozenset()  # every "NAME = 1" of the CPU section
    sve_cnt: int = 0  # SVE_CNT: SVE vector bytes, when it has SVE
    host_buffer: bool = False  # a GPU backend is built in: its pinned host buffer comes first

    def has(self, flag: str) -> bool:
        return flag in self.flags

    @property
    def repacks(self) -> bool:
        """Built with the repack buffer, and layers in RAM reach it (no GPU host buffer)."""
        return self.has("REPACK") and not self.host_buffer


@dataclass(frozen=True)
class WeightTensor:
    """One tensor of the file as the repack rule needs it (models/ reads the header)."""

    layer: int  # -1: the input layer; 0..n_layer-1: a block; n_layer: the output layer
    type: str  # ggml type as gguf names it: "Q4_K", "IQ4_NL", "F32"
    rows: int  # ne[1]
    dims: int  # ggml_n_dims
    op: str  # what the graph does with it: MUL_MAT, MUL_MAT_ID, or "" for anything else
    offset: int  # where its data starts in the file
    n_bytes: int
    duplicate: bool = False  # the tied output: token_embd again (TENSOR_DUPLICATED)


def kernel(type_name: str, rows: int, cpu: CpuFeatures) -> str | None:
    """The interleaved layout ggml_repack_get_optimal_repack_type picks (repack.cpp), or None.
    x86 and ARM only: RISC-V's layouts also need a compile flag the engine does not print."""
    avx2, avx512 = cpu.has("AVX2"), cpu.has("AVX512")
    neon = cpu.has("NEON")
    i8mm, dot = neon and cpu.has("MATMUL_INT8"), neon and cpu.has("DOTPROD")
    sve256 = cpu.has("SVE") and cpu.has("MATMUL_INT8") and cpu.sve_cnt == 32
    rules: dict[str, tuple[tuple[bool, int, str], ...]] = {
        "Q4_0": (
            (avx2 or sve256, 8, "8x8"),
            (i8mm, 4, "4x8"),
            (dot, 4, "4x4"),
            (cpu.has("VXE"), 4, "4x4"),
        ),
        "Q4_K": ((avx2, 8, "8x8"), (i8mm, 8, "8x8"), (dot, 8, "8x4")),
        "Q2_K": ((avx512, 8, "8x8"),),
        "Q5_K": ((i8mm, 8, "8x8"), (dot, 8, "8x4")),
        "Q6_K": ((i8mm, 8, "8x8"), (dot, 8, "8x4")),
        "IQ4_NL": ((avx2, 8, "8x8"), (dot, 4, "4x4")),
        "MXFP4": ((avx2, 8, "8x8"), (dot, 4, "4x4")),
        "Q8_0": ((i8mm, 4, "4x8"), (dot, 4, "4x4")),
        "Q1_0": ((i8mm, 4, "4x8"), (dot, 4, "4x4")),
    }
    for ok, multiple, layout in rules.get(type_name, ()):
        if ok and rows % multiple == 0:
            return layout
    return None


def repacked(t: WeightTensor, cpu: CpuFeatures) -> bool:
    """Whether the repack buffer type takes this tensor: a 2-D matrix product's weight or a
    3-D expert weight (supports_op), of a type and row count a kernel exists for."""
    if not cpu.repacks:
        return False
    if (t.op, t.dims) not in ((MUL_MAT, 2), (MUL_MAT_ID, 3)):
        return False
    return kernel(t.type, t.rows, cpu) is not None


@dataclass(frozen=True)
class HostWeights:
    mapped: int  # the span of the file the tensors left in the mapping cover
    repacked: int  # the repack buffer: each copy padded to TENSOR_ALIGNMENT
    summed: int  # Σ bytes of the tensors in RAM (the estimate without this rule)

    @property
    def total(self) -> int:
        return self.mapped + self.repacked

    @property
    def extra(self) -> int:
        """What the rule adds to the plain sum (0 when nothing repacks)."""
        return self.total - self.summed if self.repacked else 0


def host_weights(
    tensors: Iterable[WeightTensor],
    cpu: CpuFeatures | None,
    in_ram: Callable[[WeightTensor], bool] = lambda t: True,
) -> HostWeights:
    """The engine's model buffers in RAM for the tensors ``in_ram`` says stay there: the
    mapped span (get_mapping_range: first offset to last end) plus the repacked copies."""
    first, last, copies, summed = -1, 0, 0, 0
    for t in tensors:
        if not in_ram(t):
            continue
        if not t.duplicate:
            summed += t.n_bytes
        if cpu is not None and repacked(t, cpu):
            copies += (t.n_bytes + TENSOR_ALIGNMENT - 1) // TENSOR_ALIGNMENT * TENSOR_ALIGNMENT
        elif not t.duplicate:
            first = t.offset if first < 0 else min(first, t.offset)
            last = max(last, t.offset + t.n_bytes)
    return HostWeights(max(last - first, 0) if first >= 0 else 0, copies, summed)


# -- the placement flag ----------------------------------------------------------------


class RepackReason(StrEnum):
    """Why a placement runs with the repacked copy or without it (``fitbox plan``)."""

    ON = "on"  # the engine repacks some weights: faster matrix products, more RAM
    NONE = "none"  # nothing to repack: the engine, the CPU, the types or the rows rule it out
    RAM_BOUND = "ram_bound"  # --no-repack: the repacked copy did not fit, the file alone does
