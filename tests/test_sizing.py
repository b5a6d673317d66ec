"""Footprint maths against figures llama-server printed (reference §3.2, §4.3)."""

from __future__ import annotations

from fitbox.core import sizing
from fitbox.core.sizing import ModelShape

TINY = ModelShape(
    weights_bytes=433_920,
    n_layer=2,
    n_ctx_train=512,
    n_embd=64,
    n_vocab=103,
    n_head=4,
    kv_heads=(2, 2),
    key_length=16,
    value_length=16,
)


def test_kv_matches_the_engine_log_for_two_slots() -> None:
    # `-c 1000 -np 2` printed n_ctx 1024, n_ctx_seq 512 and a 0.25 MiB KV buffer
    assert sizing.kv_cells(1000, 2, unified=False) == (512, 2)
    assert sizing.kv_bytes(TINY, 1000, 2).total == 256 * 1024


def test_kv_unified_is_one_stream_of_the_padded_window() -> None:
    assert sizing.kv_cells(512, 4, unified=True) == (512, 1)
    assert sizing.kv_bytes(TINY, 512, 4, unified=True).total == 128 * 1024


def test_window_is_padded_and_capped_at_training_context() -> None:
    assert sizing.pad(1000) == 1024
    assert sizing.effective_window(TINY, 4096) == 512


def test_layers_without_kv_heads_cost_nothing() -> None:
    shape = ModelShape(0, 2, 512, 64, 10, 4, (2, 0), 16, 16)
    assert sizing.kv_bytes(shape, 512, 1).total == 2 * (16 + 16) * 2 * 512


def test_footprint_adds_every_term() -> None:
    fp = sizing.footprint(TINY, 512, 1)
    assert fp.total == fp.weights + fp.kv + fp.compute + fp.output
    assert fp.weights == TINY.weights_bytes and fp.kv > 0 and fp.compute > 0


def test_quantized_cache_types_use_ggml_block_sizes() -> None:
    shape = ModelShape(0, 2, 4096, 128, 10, 4, (2, 2), 32, 32)
    f16 = sizing.kv_bytes(shape, 4096, 1)
    q8 = sizing.kv_bytes(shape, 4096, 1, type_k="q8_0", type_v="q8_0")
    q4 = sizing.kv_bytes(shape, 4096, 1, type_k="q4_0", type_v="f16")
    assert f16.k == 2 * 2 * 32 * 2 * 4096  # layers x heads x dim x 2 B x cells
    assert q8.k == 2 * (2 * 32 // 32 * 34) * 4096
    assert q4.k == 2 * (2 * 32 // 32 * 18) * 4096 and q4.v == f16.v


def test_cache_types_the_engine_would_refuse_are_named() -> None:
    tiny = TINY  # head dim 16: a 32-wide block does not divide it
    assert "does not divide the head dim 16" in str(
        sizing.kv_type_problem(tiny, "q8_0", "f16", flash_attn=True)
    )
    assert "flash attention" in str(sizing.kv_type_problem(tiny, "f16", "q8_0", flash_attn=False))
    assert "not one of" in str(sizing.kv_type_problem(tiny, "q3_k", "f16", flash_attn=True))
    assert sizing.kv_type_problem(tiny, "f16", "bf16", flash_attn=False) is None


def test_swa_layers_get_the_swa_cache_size() -> None:
    # 6 layers, every layer but each 6th is SWA with a 128-token window (gemma3's rule)
    swa = tuple(il % 6 < 5 for il in range(6))
    shape = ModelShape(0, 6, 8192, 64, 10, 4, (2,) * 6, 16, 16, n_swa=128, swa_layers=swa)
    kv = sizing.kv_bytes(shape, 8192, 1)
    assert kv.full_cells == 8192 and kv.swa_cells == sizing.pad(128 + 512) == 768
    per_cell = 2 * 16 * 2  # K of one layer: 2 heads x 16 x f16
    assert kv.k == per_cell * (1 * 8192 + 5 * 768)
    full = sizing.kv_bytes(shape, 8192, 1, swa_full=True)
    assert full.k == per_cell * 6 * 8192
    unified = sizing.kv_bytes(shape, 8192, 4, unified=True)
    assert unified.swa_cells == sizing.pad(128 * 4 + 512)


def test_mla_keeps_k_only_and_recurrent_state_is_f32_per_sequence() -> None:
    mla = ModelShape(0, 2, 4096, 64, 10, 4, (1, 1), 576, 512, is_mla=True)
    kv = sizing.kv_bytes(mla, 4096, 1)
    assert kv.v == 0 and kv.k == 2 * 576 * 2 * 4096
    mamba = ModelShape(
        0,
        3,
        4096,
        64,
        10,
        0,
        (0, 0, 0),
        0,
        0,
        recurrent_layers=(True, True, True),
        n_embd_r=3 * 128,
        n_embd_s=16 * 128,
    )
    assert sizing.kv_bytes(mamba, 4096, 2).total == 0
    assert sizing.recurrent_bytes(mamba, 2) == 3 * (3 * 128 + 16 * 128) * 4 * 2


# -- flash attention off ------------------------------------------------------------------
# Figures the engine printed for the zoo's deci model (KV heads 4, 2, 1, 0; head dim 32) and
# an F16 llama (n_embd 512, 8 heads, 4 KV heads, n_ff 1536), -fa off, bench/estimate_accuracy.

DECI = ModelShape(0, 4, 4096, 128, 112, 4, (4, 2, 1, 0), 32, 32, n_ff=256)
LLAMA = ModelShape(0, 2, 8192, 512, 112, 8, (4, 4), 64, 64, n_ff=1536)


def test_without_flash_attention_a_varying_v_is_padded_to_the_widest_layer() -> None:
    on = sizing.kv_bytes(DECI, 256, 1)
    off = sizing.kv_bytes(DECI, 256, 1, flash_attn=False)
    assert on.k == off.k == (4 + 2 + 1) * 32 * 2 * 256
    assert on.v == on.k and off.v == 4 * 128 * 2 * 256  # every cache layer, the 0-head one too
    assert sizing.padded_v_width(LLAMA) == 0  # equal widths: nothing padded
    assert sizing.kv_bytes(LLAMA, 1024, 1, flash_attn=False) == sizing.kv_bytes(LLAMA, 1024, 1)


def test_without_flash_attention_the_kq_matrix_joins_the_compute_buffer() -> None:
    # measured: 26,224,886 B at 1024 cells, 82,847,990 at 4096 (0.01 MiB rounding aside)
    assert abs(sizing.compute_bytes(LLAMA, 1024, 1, flash_attn=False) - 26_224_886) < 1024
    assert abs(sizing.compute_bytes(LLAMA, 4096, 1, flash_attn=False) - 82_847_990) < 1024
    per_cell = 512 * 4 * (8 + 1)  # n_ubatch x f32 x (n_head KQ + the f32 mask)
    grows = sizing.compute_bytes(LLAMA, 2048, 1, flash_attn=False) - sizing.compute_bytes(
        LLAMA, 1024, 1, flash_attn=False
    )
    assert grows == 1024 * per_cell
    # a quantized K cache: 4 x n_embd + max(n_embd, 256) + 2 x K + 15 beside the KQ row
    q8 = sizing.compute_bytes(LLAMA, 2048, 1, flash_attn=False, type_k="q8_0")
    assert q8 == 512 * 4 * (2048 * 9 + 4 * 512 + 512 + 2 * 256 + 15)
    assert q8 < sizing.compute_bytes(LLAMA, 2048, 1, flash_attn=False)
    # the flash-attention buffer is far smaller: no KQ matrix, an f16 mask
    assert (
        sizing.compute_bytes(LLAMA, 4096, 1)
        < sizing.compute_bytes(LLAMA, 4096, 1, flash_attn=False) / 4
    )
