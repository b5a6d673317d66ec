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
    assert sizing.kv_bytes(TINY, 1000, 2) == 256 * 1024


def test_kv_unified_is_one_stream_of_the_padded_window() -> None:
    assert sizing.kv_cells(512, 4, unified=True) == (512, 1)
    assert sizing.kv_bytes(TINY, 512, 4, unified=True) == 128 * 1024


def test_window_is_padded_and_capped_at_training_context() -> None:
    assert sizing.pad(1000) == 1024
    assert sizing.effective_window(TINY, 4096) == 512


def test_layers_without_kv_heads_cost_nothing() -> None:
    shape = ModelShape(0, 2, 512, 64, 10, 4, (2, 0), 16, 16)
    assert sizing.kv_bytes(shape, 512, 1) == 2 * (16 + 16) * 2 * 512


def test_footprint_adds_every_term() -> None:
    fp = sizing.footprint(TINY, 512, 1)
    assert fp.total == fp.weights + fp.kv + fp.compute + fp.output
    assert fp.weights == TINY.weights_bytes and fp.kv > 0 and fp.compute > 0
