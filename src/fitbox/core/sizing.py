"""Footprints from model shape: what llama-server allocates for a window. Pure maths.

Every term is written down, with the llama.cpp source it mirrors, in FORMULAS.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from fitbox.core.types import Footprint

KV_PAD = 256  # llama-context.cpp: n_ctx = GGML_PAD(n_ctx, 256)
DEFAULT_UBATCH = 512  # common.h: n_ubatch default
F16_BYTES = 2
F32_BYTES = 4
ACTIVATION_BYTES_PER_EMBD = 64  # fitted to measured CPU compute buffers, FORMULAS.md


@dataclass(frozen=True)
class ModelShape:
    """The header facts sizing needs (models/ reads them from GGUF files)."""

    weights_bytes: int
    n_layer: int
    n_ctx_train: int
    n_embd: int
    n_vocab: int
    n_head: int
    kv_heads: tuple[int, ...]  # per layer; 0 means the layer keeps no KV
    key_length: int
    value_length: int


def pad(n: int, multiple: int = KV_PAD) -> int:
    return (n + multiple - 1) // multiple * multiple


def effective_window(shape: ModelShape, window: int) -> int:
    """The window fitbox asks for: the setting, capped at the training context."""
    if shape.n_ctx_train > 0:
        window = min(window, shape.n_ctx_train)
    return max(window, 1)


def kv_cells(window: int, parallel: int, unified: bool) -> tuple[int, int]:
    """(cells per stream, streams) llama.cpp builds for ``-c window -np parallel``."""
    n_ctx = pad(window)
    if unified or parallel <= 1:
        return n_ctx, 1
    return pad(n_ctx // parallel), parallel


def kv_bytes(shape: ModelShape, window: int, parallel: int, unified: bool = False) -> int:
    """f16 K and V for every layer that keeps KV (llama-kv-cache.cpp, FORMULAS.md §KV)."""
    cells, streams = kv_cells(window, parallel, unified)
    per_cell = sum(
        heads * (shape.key_length + shape.value_length) * F16_BYTES for heads in shape.kv_heads
    )
    return per_cell * cells * streams


def output_bytes(shape: ModelShape, parallel: int) -> int:
    """Logits for one output per sequence (llama-context.cpp output_reserve)."""
    return shape.n_vocab * F32_BYTES * max(parallel, 1)


def compute_bytes(shape: ModelShape, window: int, parallel: int) -> int:
    """First-cut allowance for the compute buffer (FORMULAS.md §Compute): per ubatch token,
    the f16 KQ mask over the KV cells plus an activation allowance of 64 bytes per n_embd."""
    cells, _ = kv_cells(window, parallel, unified=False)
    return DEFAULT_UBATCH * (F16_BYTES * cells + ACTIVATION_BYTES_PER_EMBD * shape.n_embd)


def footprint(shape: ModelShape, window: int, parallel: int) -> Footprint:
    window = effective_window(shape, window)
    return Footprint(
        weights=shape.weights_bytes,
        kv=kv_bytes(shape, window, parallel),
        compute=compute_bytes(shape, window, parallel),
        output=output_bytes(shape, parallel),
    )
