"""Footprints from model shape: what llama-server allocates for a window. Pure maths.

Every term is written down, with the llama.cpp source it mirrors, in FORMULAS.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fitbox.core.projector import ProjectorShape, with_projector
from fitbox.core.repack import CpuFeatures, WeightTensor, host_weights
from fitbox.core.types import Footprint

KV_PAD = 256  # llama-context.cpp: n_ctx = GGML_PAD(n_ctx, 256); the SWA cache is padded too
DEFAULT_UBATCH = 512  # common.h: n_ubatch default
F16_BYTES = 2
F32_BYTES = 4
# Compute buffer per ubatch token, in f32 values: 5 x n_embd + 3 x n_ff + a few, fitted to
# the engine's own CPU compute buffers across dense, GQA, SWA and MoE models (FORMULAS.md).
COMPUTE_PER_EMBD = 5
COMPUTE_PER_FF = 3
COMPUTE_EXTRA = 16
# Flash attention off: at the attention peak a ubatch token holds its f32 KQ row (n_head x
# cells), its f32 mask row per cache, and 6 x n_embd + 2 x the widest K row + 5 f32 values
# beside them; with a quantized K cache 4 x n_embd + max(n_embd, 256) + 2 x K + 15 (fitted
# on llama shapes of n_embd 128-1024 and the zoo, FORMULAS.md §Compute).
NO_FA_PER_EMBD = 6
NO_FA_PER_K = 2
NO_FA_EXTRA = 5
NO_FA_QUANT_K_FLOOR = 256
NO_FA_QUANT_K_EXTRA = 15

# Every cache type llama-server accepts (-ctk/-ctv): (block size, bytes per block), from
# ggml/src/ggml-common.h block structs and ggml.c type_traits.
KV_TYPES: dict[str, tuple[int, int]] = {
    "f32": (1, 4),
    "f16": (1, 2),
    "bf16": (1, 2),
    "q8_0": (32, 34),
    "q4_0": (32, 18),
    "q4_1": (32, 20),
    "iq4_nl": (32, 18),
    "q5_0": (32, 22),
    "q5_1": (32, 24),
}


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
    # sliding-window attention: which layers, how wide, and their head dims
    n_swa: int = 0
    swa_layers: tuple[bool, ...] = ()
    key_length_swa: int = 0  # 0: same as key_length
    value_length_swa: int = 0
    is_mla: bool = False  # MLA caches K only (llama-kv-cache.cpp: has_v = !is_mla)
    has_kv_cache: bool = True  # encoder-only models (bert, ...) build none
    recurrent_layers: tuple[bool, ...] = ()
    n_embd_r: int = 0  # per recurrent layer and sequence, f32 elements (llama-hparams.cpp)
    n_embd_s: int = 0
    n_ff: int = 0  # the widest FFN a token passes: dense, shared, or experts used x width
    ssm_values: int = 0  # extra f32 values per ubatch token in SSM layers (Mamba scans)
    weights_by_kind: dict[str, int] = field(default_factory=dict, compare=False, hash=False)
    # every tensor, for the repack rule (core/repack.py); empty: priced by weights_bytes alone
    tensors: tuple[WeightTensor, ...] = field(default=(), compare=False, hash=False)

    def is_swa(self, il: int) -> bool:
        return self.n_swa > 0 and il < len(self.swa_layers) and self.swa_layers[il]

    def is_recurrent(self, il: int) -> bool:
        return il < len(self.recurrent_layers) and self.recurrent_layers[il]

    def head_dims(self, il: int) -> tuple[int, int]:
        if self.is_swa(il):
            return (
                self.key_length_swa or self.key_length,
                self.value_length_swa or self.value_length,
            )
        return self.key_length, self.value_length


@dataclass(frozen=True)
class KVBytes:
    k: int
    v: int
    full_cells: int  # cells per stream of the full-attention cache
    swa_cells: int  # cells per stream of the SWA cache (0: none)
    streams: int

    @property
    def total(self) -> int:
        return self.k + self.v


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


def row_bytes(kv_type: str, n_elements: int) -> int:
    """ggml_row_size: whole blocks of the type."""
    block, size = KV_TYPES[kv_type]
    return n_elements // block * size


def kv_type_problem(shape: ModelShape, type_k: str, type_v: str, flash_attn: bool) -> str | None:
    """Why llama-server would refuse these cache types for this model, or None."""
    for name, kind in (("K", type_k), ("V", type_v)):
        if kind not in KV_TYPES:
            return f"{name} cache type {kind!r} is not one of {', '.join(KV_TYPES)}"
    if KV_TYPES[type_v][0] > 1 and not flash_attn:
        return "a quantized V cache needs flash attention (llama-context.cpp)"
    for il in range(shape.n_layer):
        k_dim, v_dim = shape.head_dims(il)
        for name, kind, dim in (("K", type_k, k_dim), ("V", type_v, v_dim)):
            block = KV_TYPES[kind][0]
            if dim and dim % block:
                return (
                    f"{name} cache type {kind} has block size {block}, which does not "
                    f"divide the head dim {dim}"
                )
    return None


def swa_cells(
    shape: ModelShape,
    cells: int,
    parallel: int,
    unified: bool,
    swa_full: bool = False,
    n_ubatch: int = DEFAULT_UBATCH,
) -> int:
    """Cells per stream of the SWA cache (llama-kv-cache-iswa.cpp); 0 without SWA layers."""
    if shape.n_swa <= 0 or not any(shape.is_swa(il) for il in range(shape.n_layer)):
        return 0
    return swa_window(shape.n_swa, cells, parallel, unified, swa_full, n_ubatch)


def swa_window(
    n_swa: int,
    cells: int,
    parallel: int,
    unified: bool,
    swa_full: bool = False,
    n_ubatch: int = DEFAULT_UBATCH,
) -> int:
    """The SWA cache's cells per stream for a model that has SWA layers (the rule alone, so a
    caller that already knows it has them need not walk the layers again)."""
    seqs = parallel if unified else 1
    return cells if swa_full else pad(min(cells, n_swa * seqs + n_ubatch))


def padded_v_width(shape: ModelShape) -> int:
    """With flash attention off V is stored transposed, and when its width varies across
    layers every layer's V takes the widest (llama-kv-cache.cpp TAG_V_CACHE_VARIABLE:
    n_embd_v_gqa_max over all layers); 0 when the widths agree (nothing is padded)."""
    widths = {
        shape.head_dims(il)[1] * (shape.kv_heads[il] if il < len(shape.kv_heads) else 0)
        for il in range(shape.n_layer)
    }
    return max(widths) if len(widths) > 1 else 0


def layer_kv_bytes(
    shape: ModelShape,
    il: int,
    cells: int,
    swa: int,
    streams: int,
    type_k: str,
    type_v: str,
    v_width: int = 0,
) -> tuple[int, int]:
    """(K, V) bytes of layer ``il``; (0, 0) for a layer that keeps no KV. ``v_width``: the
    padded V row of a cache without flash attention (``padded_v_width``), 0 if unpadded;
    a cache layer with no KV heads then still holds a V of that width."""
    heads = shape.kv_heads[il] if il < len(shape.kv_heads) else 0
    if not shape.has_kv_cache or shape.is_recurrent(il) or (heads == 0 and not v_width):
        return 0, 0
    k_dim, v_dim = shape.head_dims(il)
    layer_cells = swa if shape.is_swa(il) else cells
    k = row_bytes(type_k, k_dim * heads) * layer_cells * streams
    v_row = row_bytes(type_v, v_width or v_dim * heads)
    v = 0 if shape.is_mla else v_row * layer_cells * streams
    return k, v


def kv_bytes(
    shape: ModelShape,
    window: int,
    parallel: int,
    *,
    type_k: str = "f16",
    type_v: str = "f16",
    unified: bool = False,
    swa_full: bool = False,
    n_ubatch: int = DEFAULT_UBATCH,
    flash_attn: bool = True,
) -> KVBytes:
    """K and V for every layer that keeps KV (llama-kv-cache.cpp, -iswa.cpp; FORMULAS §KV)."""
    cells, streams = kv_cells(window, parallel, unified)
    swa = swa_cells(shape, cells, parallel, unified, swa_full, n_ubatch)
    v_width = 0 if flash_attn else padded_v_width(shape)
    k = v = 0
    for il in range(shape.n_layer):
        layer_k, layer_v = layer_kv_bytes(shape, il, cells, swa, streams, type_k, type_v, v_width)
        k, v = k + layer_k, v + layer_v
    return KVBytes(k=k, v=v, full_cells=cells, swa_cells=swa, streams=streams)


def recurrent_bytes(shape: ModelShape, parallel: int) -> int:
    """R and S state per recurrent layer, always f32 (llama-memory-recurrent.cpp)."""
    layers = sum(1 for il in range(shape.n_layer) if shape.is_recurrent(il))
    return layers * recurrent_layer_bytes(shape, parallel)


def recurrent_layer_bytes(shape: ModelShape, parallel: int) -> int:
    """R and S state of one recurrent layer: f32, one row per sequence."""
    return (shape.n_embd_r + shape.n_embd_s) * F32_BYTES * max(1, parallel)


def output_bytes(shape: ModelShape, parallel: int) -> int:
    """Logits for one output per sequence (llama-context.cpp output_reserve)."""
    return shape.n_vocab * F32_BYTES * max(parallel, 1)


def ubatch(window: int) -> int:
    """llama-context.cpp: n_batch = min(n_ctx, 2048); n_ubatch = min(n_batch, 512)."""
    return min(DEFAULT_UBATCH, pad(window), 2048)


def compute_bytes(
    shape: ModelShape,
    window: int,
    parallel: int,
    unified: bool = False,
    flash_attn: bool = True,
    type_k: str = "f16",
) -> int:
    """The compute buffer (FORMULAS.md §Compute): per ubatch token, a KQ mask over each
    cache's cells plus the widest activations of a layer; without flash attention also
    the f32 KQ matrix, whichever peak is larger."""
    cells, _ = kv_cells(window, parallel, unified)
    attends = [
        il
        for il in range(shape.n_layer)
        if shape.has_kv_cache and shape.kv_heads[il] and not shape.is_recurrent(il)
    ]
    full = any(not shape.is_swa(il) for il in attends)
    swa = swa_cells(shape, cells, parallel, unified) if attends else 0
    mask = (cells if full else 0) + swa
    if flash_attn:
        return compute_for_mask(shape, window, mask)
    return compute_without_fa(shape, window, mask, cells if full else swa, type_k)


def compute_for_mask(
    shape: ModelShape, window: int, mask_cells: int, mask_bytes: int = F16_BYTES
) -> int:
    """The compute buffer once the KQ mask's cells are known (they depend on which layers
    attend, which a caller may have worked out once for many windows)."""
    values = (
        COMPUTE_PER_EMBD * shape.n_embd
        + COMPUTE_PER_FF * shape.n_ff
        + COMPUTE_EXTRA
        + shape.ssm_values
    )
    return ubatch(window) * (mask_bytes * mask_cells + F32_BYTES * values)


def compute_without_fa(
    shape: ModelShape, window: int, mask_cells: int, kq_cells: int, type_k: str = "f16"
) -> int:
    """Flash attention off (llama-graph.cpp build_attn_mha, the ``kq`` branch): the mask is
    f32, and the peak is either the layer's activations or the attention step, where the
    f32 KQ matrix [kq_cells, n_ubatch, n_head] (the widest cache's cells) is alive."""
    layers = range(min(shape.n_layer, len(shape.kv_heads)))
    widest_k = max((shape.head_dims(il)[0] * shape.kv_heads[il] for il in layers), default=0)
    e = shape.n_embd
    if KV_TYPES.get(type_k, (1, 0))[0] > 1:  # a quantized K cache
        beside = 4 * e + max(e, NO_FA_QUANT_K_FLOOR) + NO_FA_QUANT_K_EXTRA
    else:
        beside = NO_FA_PER_EMBD * e + NO_FA_EXTRA
    attention = (
        ubatch(window)
        * F32_BYTES
        * (shape.n_head * kq_cells + mask_cells + beside + NO_FA_PER_K * widest_k)
    )
    return max(attention, compute_for_mask(shape, window, mask_cells, F32_BYTES))


def footprint(
    shape: ModelShape,
    window: int,
    parallel: int,
    *,
    type_k: str = "f16",
    type_v: str = "f16",
    unified: bool = False,
    cpu: CpuFeatures | None = None,
    flash_attn: bool = True,
    projector: ProjectorShape | None = None,
) -> Footprint:
    """Everything in one place. ``cpu``: the engine's CPU features when that place is host
    RAM (the repack rule, core/repack.py); None prices the file's bytes alone. ``projector``:
    launched with ``--mmproj`` (core/projector.py)."""
    window = effective_window(shape, window)
    kv = kv_bytes(
        shape,
        window,
        parallel,
        type_k=type_k,
        type_v=type_v,
        unified=unified,
        flash_attn=flash_attn,
    )
    text = Footprint(
        weights=shape.weights_bytes + host_weights(shape.tensors, cpu).extra,
        kv=kv.total + recurrent_bytes(shape, parallel),
        compute=compute_bytes(shape, window, parallel, unified, flash_attn, type_k),
        output=output_bytes(shape, parallel),
    )
    return with_projector(text, projector)
